"""The learning plan: does on-policy distillation from a teacher that knows more add to SFT, and to RL?

The teacher is fitted once (``python -m bench.learning.teacher_fit``: the base model, LoRA SFT under the hint
prompt until it passes its gate, committed as an adapter). Every arm of the core suite starts from the same warm
start per training seed and gets the same student steps, calls, rollout seeds and carried AdamW; each is a config
of ``agentmem train`` (``examples/learning/``), listed in ``suite.ARMS``. ``python -m bench.learning`` runs a pilot
or one seed per unit of work through the product's jobs (``campaign``), writes one record per arm-seed under
``bench/results/learning/records/`` and rebuilds ``bench/results/learning/REPORT.md`` from the records
(``report``). docs/learning.md explains the method and how to reproduce it.
"""
