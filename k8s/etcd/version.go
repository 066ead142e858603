package main

import "go.etcd.io/etcd/api/v3/version"

func serverVersion() string { return "etcd Version: " + version.Version }
