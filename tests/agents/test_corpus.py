"""The offline corpus the benchmarks and examples train on is the same text in every process.

``stdlib_text()`` collects standard-library docstrings. It used to read every attribute of each
module, so its text depended on what the process had imported before (a package's submodules
appear among its attributes once imported; typing_extensions patches private functions of
typing): a benchmark invocation that started the service first trained on different data from
one that did not (422 vs 428 docstrings), and arms run in separate invocations were not compared
on the same data."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import warnings; warnings.simplefilter("ignore")
{imports}
import hashlib
from actuator.agents.corpus import stdlib_text
text = stdlib_text()
print(len(text), hashlib.sha1("\\x00".join(text).encode()).hexdigest())
"""


def corpus_in_a_process(imports: str) -> str:
    out = subprocess.run([sys.executable, "-c", CODE.format(imports=imports)], capture_output=True, text=True,
                         timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_the_corpus_does_not_depend_on_what_the_process_imported_before():
    plain = corpus_in_a_process("")
    assert int(plain.split()[0]) > 200  # enough prose to cut into training blocks
    for imports in ("import actuator.api.app, uvicorn, httpx",  # a benchmark that starts the service first
                    "import transformers, torch",  # typing_extensions patches typing's private functions
                    "import email.message, concurrent.futures.process, logging.handlers, asyncio.subprocess"):
        assert corpus_in_a_process(imports) == plain, imports
