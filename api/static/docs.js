// /docs: Swagger UI (vendored, api/static/vendor/swagger-ui) on the service's OpenAPI document.
// A file of its own: the page's Content-Security-Policy allows no inline script.
"use strict";
(function () {
  const el = document.getElementById("swagger-ui");
  window.ui = window.SwaggerUIBundle({
    url: el.dataset.openapi,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    presets: [window.SwaggerUIBundle.presets.apis, window.SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
})();
