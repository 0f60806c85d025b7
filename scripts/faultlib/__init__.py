"""The fault harness's library: network namespaces as hosts (net), processes inside them
(procs), real multi-node deployments of each backend (deploy, deploy_kv, deploy_sql), the
nemeses, the workload, the checker. `scripts/faults` is the command that drives them."""
