"""``opsbot eval``: incident cases through the whole pipeline, answers scored against what a correct
answer must contain.

- :mod:`bot.eval.cases`: the case format (cluster state, Prometheus series, alert or question, what
  a correct answer names) and its loader; the built-in cases are in ``bot/eval/cases/*.yaml``.
- :mod:`bot.eval.kube_api`: the Kubernetes API server a case's cluster state is served by.
- :mod:`bot.eval.prom_api`: the Prometheus HTTP API a case's series and alerts are served by.
- :mod:`bot.eval.scorer`: object named, reason named, numbers exact, hallucinated objects.
- :mod:`bot.eval.runner`: one case = servers up, settings pointed at them, one message through
  :class:`~bot.pipeline.Pipeline` with a capturing adapter, the answer scored.
- :mod:`bot.eval.report`: JSON, Markdown and the one-line summary.
"""
