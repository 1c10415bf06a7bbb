"""Batch analysis: a shift's alerts, a change log or an incident timeline summarised in one run.

The flow (``opsbot analyze`` standalone, or ``POST /analyze`` inside a running bot)::

    input (Alertmanager JSON / JSONL of alerts or Kubernetes events / log files)
      -> readers.py   records, bad lines with their line numbers (never fatal)
      -> grouping.py  near-identical records grouped (instance-like labels, repeats merged)
      -> work.py      one prompt per group (the bot's system prompt and fences), stable item ids,
                      what grouping saved in requests and tokens
      -> runner.py    offline vLLM static batch, or any engine in the background lane; results
                      appended as they finish (results.py), a row per item in the store
      -> report.py    report.json, report.md, counts.png; post.py: the summary into a chat thread

``job.py`` runs that flow once for both entry points; ``command.py`` is the CLI's side,
``service.py`` the HTTP endpoint's.
"""
