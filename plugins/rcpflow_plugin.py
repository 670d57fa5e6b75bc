"""The rcpflow Airflow plugin. Empty for now: it is where rcpflow's UI views will register.
Operators and triggers are ordinary modules of `tasks.backends`, not plugin members."""

from airflow.plugins_manager import AirflowPlugin


class RcpflowPlugin(AirflowPlugin):
    name = "rcpflow"
