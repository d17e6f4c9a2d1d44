"""Helpers that the tests and the benchmarks share: tiny random models and a trained toy tokenizer
(``tiny_models``), realistic store records (``store_records``), the ``kill -9`` fault machinery of the job
processes (``faults``) and a rollout worker process on a scripted backend (``scripted_worker``, run as
``python -m agentmem.testing.scripted_worker``). Nothing in the library imports this package."""
