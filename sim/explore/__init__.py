"""The what-if explorer: ``decodesim explore``, a local web page over the CLI's own answers.

Pick hardware, model, weight and KV formats, software stack, MoE dispatch, batch, context
and ``--set`` overrides; the page shows ms per token with its bound and verdict, the step
breakdown, the roofline of one step, latency against batch and against context with the
target line, two configurations side by side, and (serving tab) a short replay per request
rate with TTFT and TPOT against rate. Every view exports as one self-contained HTML file
(``decodesim run --html FILE``; study reports write ``report.html`` beside ``report.md``)
that opens offline.

How it is built, and why this way:

* **The server is Python's standard ``http.server``** (``ThreadingHTTPServer`` bound to
  127.0.0.1) answering a handful of JSON routes. The page needs no sessions, templates,
  websockets or auth, so a web framework (Dash, Panel/Bokeh, Streamlit, FastAPI) would add
  a dependency tree and its own server for nothing; a stdlib server also starts in the time
  the CLI does.
* **Plotly (the ``plotly`` Python package, MIT, well kept) supplies the charts**, used only
  for the ``plotly.min.js`` it bundles: the page loads it from the server, and an exported
  HTML file inlines it, so the export opens with no network. The figures are plain Plotly
  JSON built here (sim.explore.figures), the same dicts on the page and in the export.
* **Every number is the CLI's own**: the page's form becomes a ``decodesim run`` argument
  list, parsed by the run command's own argparse options and ``spec_from_args``, and run by
  ``sim.run.simulate`` (serving: ``sim.serve.replay.serve`` on the ``ServeSpec`` the
  ``serve`` command builds). Bad input gets the CLI's one-line messages
  (``decodesim: command line: batch: must be ...``).
* **No file-system path is reachable from the page**: hardware, model, formats, stack and
  routing must be names of the bundled lists (sim.paths), ``--set`` may not set a file
  field to a path, and the server serves only its page and the bundled Plotly script.

Modules: ``html`` (self-contained HTML, study reports as HTML), ``figures`` (Plotly figure
dicts), ``compute`` (roofline, curves and ``run --html`` from a RunSpec), ``views`` (form ->
argument list -> spec -> views, through the CLI's parser), ``server`` (routes), and
``page.html`` (the page; its script only draws what the server sends).
"""
