"""Reliability under faults (issue 11): replicas, database, engine, context, shutdown, alert storms."""
