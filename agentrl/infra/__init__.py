"""What the subsystems share: the local Ray cluster and actor options (`cluster`), signals of a
run (`signals`), HTTP with a deadline, JSONL reading with file:line errors, the web corpus
server, a small on-disk cache of JSON records (`jsoncache`)."""
