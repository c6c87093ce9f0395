"""Real HotpotQA questions in the official dev-distractor format, built offline.

Eleven questions (and gold answers) of the HotpotQA dev set, with their two gold Wikipedia
paragraphs written out by hand from the articles' lead sections (paraphrased, shorter than the
originals), and the other questions' gold paragraphs as the eight distractors, so each record has
ten paragraphs of real prose like an official dev-distractor record. Nothing is downloaded. It is
not the official file: use it for what the synthetic set cannot show (real names, real question
phrasing, real-length prompts: ~1,000 tokens against ~600), not for leaderboard numbers.
"""

from __future__ import annotations

import hashlib
import random

__all__ = ["realformat_records"]

# title -> sentences (HotpotQA keeps the leading space of every sentence after the first)
PARAGRAPHS: dict[str, list[str]] = {
    "Scott Derrickson": [
        "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer.",
        " He lives in Los Angeles, California.",
        " He is best known for directing horror films such as \"Sinister\", \"The Exorcism of Emily Rose\","
        " and \"Deliver Us From Evil\", as well as the 2016 Marvel Cinematic Universe installment, \"Doctor Strange.\"",
    ],
    "Ed Wood": [
        "Edward Davis Wood Jr. (October 10, 1924 – December 10, 1978) was an American filmmaker, actor, writer,"
        " producer, and director.",
        " In the 1950s he made a number of low-budget films in various genres.",
        " His films were later celebrated for their technical errors and unusual dialogue.",
    ],
    "Kiss and Tell (1945 film)": [
        "Kiss and Tell is a 1945 American comedy film starring then 17-year-old Shirley Temple as Corliss Archer.",
        " In the film, two teenage girls cause their respective parents much concern when they start to become"
        " interested in boys.",
        " The parents' bickering about which girl is the worse influence causes more problems than it solves.",
    ],
    "Shirley Temple": [
        "Shirley Temple Black (April 23, 1928 – February 10, 2014) was an American actress, singer, dancer,"
        " businesswoman, and diplomat who was Hollywood's number one box-office draw as a child actress from"
        " 1935 to 1938.",
        " As an adult, she was named United States ambassador to Ghana and to Czechoslovakia and also served as"
        " Chief of Protocol of the United States.",
    ],
    "Animorphs": [
        "Animorphs is a science fantasy series of young adult books written by Katherine Applegate and her"
        " husband Michael Grant, writing together under the name K. A. Applegate, and published by Scholastic.",
        " It is told in first person, with all six main characters taking turns narrating the books through"
        " their own perspectives.",
        " Horror, war, dehumanization, sanity, morality, innocence, leadership, freedom and growing up are the"
        " core themes of the series.",
    ],
    "The Hork-Bajir Chronicles": [
        "The Hork-Bajir Chronicles is the second companion book to the \"Animorphs\" series, written by"
        " K. A. Applegate.",
        " With respect to continuity within the series, it takes place before book #23, \"The Pretender\","
        " although the events told in the story occur between the time of \"The Ellimist Chronicles\" and"
        " \"The Andalite Chronicles\".",
        " The book is introduced by Tobias, who flies to the valley of the free Hork-Bajir, where Jara Hamee"
        " tells him the story of how the Yeerks enslaved the Hork-Bajir.",
    ],
    "Laleli Mosque": [
        "The Laleli Mosque (Turkish: \"Laleli Camii, or Tulip Mosque\") is an 18th-century Ottoman imperial"
        " mosque located in Laleli, Fatih, Istanbul, Turkey.",
        " It was built by Sultan Mustafa III between 1760 and 1763.",
    ],
    "Esma Sultan Mansion": [
        "The Esma Sultan Mansion (Turkish: \"Esma Sultan Yalısı\"), a historical yalı (English: waterside"
        " mansion) located at Bosphorus in Ortaköy neighborhood of Istanbul, Turkey and named after its"
        " original owner Esma Sultan, is used today as a cultural center after being redeveloped.",
    ],
    "Big Stone Gap (film)": [
        "Big Stone Gap is a 2014 American drama romantic comedy film written and directed by Adriana Trigiani"
        " and produced by Donna Gigliotti for Altar Identity Studios, a subsidiary of Media Society.",
        " Based on Trigiani's 2000 best-selling novel of the same name, the story is set in the actual Virginia"
        " town of Big Stone Gap circa 1970s.",
        " The film had its world premiere at the Virginia Film Festival on November 6, 2014.",
    ],
    "Adriana Trigiani": [
        "Adriana Trigiani is an Italian American best-selling author of sixteen books, television writer,"
        " film director, and entrepreneur based in Greenwich Village, New York City.",
        " Trigiani has published a novel a year since 2000.",
    ],
    "2014 S/S": [
        "2014 S/S is the debut album of South Korean group WINNER.",
        " It was released on August 12, 2014 by the group's record label, YG Entertainment.",
        " The members were credited for writing the lyrics and composing the majority of the album's songs.",
    ],
    "Winner (band)": [
        "Winner (Hangul: 위너), often stylized as WINNER, is a South Korean boy group formed in 2013 by"
        " YG Entertainment and debuted in 2014.",
        " It currently consists of four members, Jinu, Hoony, Mino and Seungyoon.",
        " The group was formed through the Mnet survival program \"WIN: Who is Next\".",
    ],
    "Annie Morton": [
        "Annie Morton (born October 8, 1970) is an American model born in Pennsylvania.",
        " She has appeared on the covers of \"British Vogue\", \"ID\", \"Marie Claire\", and other magazines.",
        " She has been photographed by Helmut Newton, Peter Lindbergh, Annie Leibovitz and Terry Richardson.",
    ],
    "Terry Richardson": [
        "Terrence \"Uncle Terry\" Richardson (born August 14, 1965) is an American fashion and portrait"
        " photographer who has shot advertising campaigns for Marc Jacobs, Aldo, Supreme, Sisley, Tom Ford,"
        " and Yves Saint Laurent among others.",
        " He has also done work for magazines such as \"Rolling Stone\", \"GQ\", \"Vogue\", \"Vanity Fair\","
        " \"Harper's Bazaar\", \"i-D\", and \"Vice\".",
    ],
    "Local H": [
        "Local H is an American rock band originally formed by guitarist and vocalist Scott Lucas, bassist"
        " Matt Garcia, drummer Joe Daniels, and lead guitarist John Sparkman in Zion, Illinois in 1987.",
        " The members all met in high school in 1987 and founded Local H three years later.",
        " The group's name comes from the Toadies song \"Local H\".",
    ],
    "For Against": [
        "For Against is an American post-punk/dream pop band from Lincoln, Nebraska, United States.",
        " Despite numerous lineup shuffles and some periods of dormancy, the band has produced material"
        " steadily since 1984.",
    ],
    "Kansas Song": [
        "Kansas Song (We're From Kansas) is a fight song of the University of Kansas.",
        " It is played by the Marching Jayhawks at football and basketball games.",
    ],
    "University of Kansas": [
        "The University of Kansas, often referred to as KU or Kansas, is a public research university in the"
        " U.S. state of Kansas.",
        " The main campus in Lawrence, one of the largest college towns in Kansas, is on Mount Oread, the"
        " highest elevation in Lawrence.",
        " Two branch campuses are in the Kansas City metropolitan area: the Edwards Campus in Overland Park,"
        " and the university's medical school and hospital in Kansas City.",
    ],
    "Lewiston Maineiacs": [
        "The Lewiston Maineiacs were a junior ice hockey team of the Quebec Major Junior Hockey League based"
        " in Lewiston, Maine.",
        " The team played its home games at the Androscoggin Bank Colisée.",
        " They were the second QMJHL team in the United States, and the only one to play a full season.",
    ],
    "Androscoggin Bank Colisée": [
        "The Androscoggin Bank Colisée (formerly Central Maine Civic Center and Lewiston Colisee) is a 4,000"
        " capacity (3,677 seated) multi-purpose arena, in Lewiston, Maine, that opened in 1958.",
        " In 1965 it was the location of the World Heavyweight Title fight during which one of the most famous"
        " sports photographs of the century was taken of Muhammad Ali standing over Sonny Liston.",
    ],
    "Eenasul Fateh": [
        "Eenasul Fateh (Bengali: ঈনাসুল ফাতেহ; born 21 April 1959), also known by his stage name Aladin, is a"
        " Bangladeshi-British cultural practitioner, magician, live artist and former international"
        " management consultant.",
    ],
    "Management consulting": [
        "Management consulting is the practice of helping organizations to improve their performance,"
        " operating primarily through the analysis of existing organizational problems and the development"
        " of plans for improvement.",
        " Organizations may draw upon the services of management consultants for a number of reasons,"
        " including gaining external (and presumably objective) advice and access to the consultants'"
        " specialized expertise.",
    ],
}

# (question, answer, type, level, [(title, sentence index), ...]) as in the dev set
QUESTIONS: list[tuple[str, str, str, str, list[tuple[str, int]]]] = [
    ("Were Scott Derrickson and Ed Wood of the same nationality?", "yes", "comparison", "hard",
     [("Scott Derrickson", 0), ("Ed Wood", 0)]),
    ("What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?",
     "Chief of Protocol", "bridge", "hard", [("Kiss and Tell (1945 film)", 0), ("Shirley Temple", 0),
                                             ("Shirley Temple", 1)]),
    ("What science fantasy young adult series, told in first person, has a set of companion books narrating the"
     " stories of enslaved worlds and alien species?", "Animorphs", "bridge", "hard",
     [("The Hork-Bajir Chronicles", 0), ("The Hork-Bajir Chronicles", 2), ("Animorphs", 0), ("Animorphs", 1)]),
    ("Are the Laleli Mosque and Esma Sultan Mansion located in the same neighborhood?", "no", "comparison",
     "hard", [("Laleli Mosque", 0), ("Esma Sultan Mansion", 0)]),
    ("The director of the romantic comedy \"Big Stone Gap\" is based in what New York city?",
     "Greenwich Village, New York City", "bridge", "hard", [("Big Stone Gap (film)", 0), ("Adriana Trigiani", 0)]),
    ("2014 S/S is the debut album of a South Korean boy group that was formed by who?", "YG Entertainment",
     "bridge", "hard", [("2014 S/S", 0), ("2014 S/S", 1), ("Winner (band)", 0)]),
    ("Who was known by his stage name Aladin and helped organizations improve their performance as a consultant?",
     "Eenasul Fateh", "bridge", "hard", [("Eenasul Fateh", 0), ("Management consulting", 0)]),
    ("The arena where the Lewiston Maineiacs played their home games can seat how many people?", "3,677 seated",
     "bridge", "hard", [("Lewiston Maineiacs", 1), ("Androscoggin Bank Colisée", 0)]),
    ("Who is older, Annie Morton or Terry Richardson?", "Terry Richardson", "comparison", "hard",
     [("Annie Morton", 0), ("Terry Richardson", 0)]),
    ("Are Local H and For Against both from the United States?", "yes", "comparison", "hard",
     [("Local H", 0), ("For Against", 0)]),
    ("What is the name of the fight song of the university whose main campus is in Lawrence, Kansas and whose"
     " branch campuses are in the Kansas City metropolitan area?", "Kansas Song", "bridge", "hard",
     [("Kansas Song", 0), ("University of Kansas", 1), ("University of Kansas", 2)]),
]


def realformat_records(distractors: int = 8, seed: int = 0) -> list[dict]:
    """The records: each question's gold paragraphs plus ``distractors`` other questions' gold
    paragraphs, in a shuffled order (fixed by ``seed``), in the official format."""
    rng = random.Random(seed)
    records = []
    for question, answer, qtype, level, facts in QUESTIONS:
        gold = list(dict.fromkeys(title for title, _ in facts))
        others = [title for title in PARAGRAPHS if title not in gold]
        titles = gold + rng.sample(others, distractors)
        rng.shuffle(titles)
        records.append({
            "_id": hashlib.sha1(question.encode()).hexdigest()[:24],
            "question": question,
            "answer": answer,
            "supporting_facts": [[title, index] for title, index in facts],
            "context": [[title, list(PARAGRAPHS[title])] for title in titles],
            "type": qtype,
            "level": level,
        })
    return records
