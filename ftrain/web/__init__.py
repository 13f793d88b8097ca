"""`ftrain ui`: a read-only web view of the log, served by the standard library's HTTP server.

`markup` escapes, `charts` draws SVG, `pages` renders HTML from the service's views (pure), `reader` reads
the log and the read model through the application service, `server` serves them behind a token. Nothing
here writes to the log; the CLI imports this package only for `ftrain ui`.
"""
