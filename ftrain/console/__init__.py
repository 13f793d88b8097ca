"""What a command shows: stdout and stderr for a person or a JSON reader, every line made visible first.

Below the command line and the supervisor alike (it reports each attempt as it ends), so neither reaches up
into the other for it. Stdlib only until a JSON document is written: every command's start-up imports it.
"""
