"""Test lab helpers: real etcd, network namespaces, wireguard-go."""
