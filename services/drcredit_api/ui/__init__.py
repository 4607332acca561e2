"""The credit viewer: pages under ``/ui`` served by the API itself, and the same pages as
one self-contained HTML file for ``drcredit report``.

The pages are Jinja2 templates that render an empty shell; the scripts of ``static/js/``
fill it from the tenant-scoped ``/v1`` JSON endpoints (with the API key a reader enters
once per browser session), so what a page shows is exactly what the API answers. Charts use
Plotly's JavaScript bundle as installed with the ``plotly`` package: nothing is fetched
from a CDN, and the viewer works without internet access. A report embeds the same JSON
under the paths it came from, with the scripts and styles inlined.
"""
