"""The Kubernetes half of the integration test bed (etcd + kube-apiserver, kubectl, helm)."""
