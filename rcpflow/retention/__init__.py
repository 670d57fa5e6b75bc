"""Deleting the checkpoints no verdict can need any more, once the verdict says so: the rule
(`rule`: pure, facts in, one decision and one named reason per checkpoint out), its application
to a run folder (`apply`: `rcpflow retention plan|apply` and the run DAG's retention tasks; sizes,
deletes, the ``retention.json`` record) and the lock that keeps applies one at a time (`lock`).
It acts on the verdict (`rcpflow.verdict`) and is no part of it. Why and when: docs/retention.md.
"""
