"""Planning a run before it runs: `rcpflow forecast` (an event simulation of the run DAG's
evaluation rules) and the rehearsal profile and pass@4 curve it and the rehearsal jobs read.
"""
