"""``agentmem view`` and ``agentmem report``: a local, read-only web app over the store, and the same pages
as one self-contained HTML file.

Pages are rendered on the server (Jinja2 templates, SVG plots drawn here, no JavaScript needed). Every
page reads the store through ``store.repository`` in one short session and never writes: the app is given
a store opened with ``store.engine.open_read_only``. Modules: ``app`` (the FastAPI factory and error pages),
one module per page (``runs``, ``run_page``, ``episode``, ``compare``, ``training``), the pure pieces they
share (``diff``, ``heat``, ``svg``, ``tokens``, ``render``) and ``report``.
"""
