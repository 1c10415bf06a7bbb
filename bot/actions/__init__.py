"""Approval-gated actions (issue 41): from a diagnosis to a change a person approves.

One role per module: :mod:`~bot.actions.catalog` (the closed set and its schemas),
:mod:`~bot.actions.kube_apply` and :mod:`~bot.actions.silences` (the write clients, on credentials
of their own), :mod:`~bot.actions.approval` (who may approve, signed buttons),
:mod:`~bot.actions.cards` (Slack and Mattermost renderings), :mod:`~bot.actions.audit` (the
proposal rows, the claim and the trail), :mod:`~bot.actions.verify` (after applying) and
:mod:`~bot.actions.service` (the one entry point: ``propose`` and ``decide``).
"""
