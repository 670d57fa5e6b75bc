"""A real Kubernetes control plane on 127.0.0.1 (docs/k8s-control-plane.md), one job a module:
the binaries, the certificates, a REST client, kwok's nodes and stages, the controllers
(JobSet, Kueue), the processes, the control plane that puts them together, and kwok's pod
runner. ``python -m devtools.k8s`` starts one for a person."""
