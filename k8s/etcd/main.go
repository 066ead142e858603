// A one-member etcd for the test node's kube-apiserver: go.etcd.io/etcd/server/v3/embed with
// a data directory and a client URL, nothing else. Serves until SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "the member's data directory")
	client := flag.String("listen-client-url", "http://127.0.0.1:2379", "where clients connect")
	peer := flag.String("listen-peer-url", "http://127.0.0.1:2380", "the member's peer URL")
	version := flag.Bool("version", false, "print the etcd server version and exit")
	flag.Parse()
	if *version {
		fmt.Println(serverVersion())
		return
	}
	if *dataDir == "" {
		log.Fatal("--data-dir is required")
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	cu, err := url.Parse(*client)
	if err != nil {
		log.Fatalf("--listen-client-url: %v", err)
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		log.Fatalf("--listen-peer-url: %v", err)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("starting etcd: %v", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd %s serving %s\n", serverVersion(), cu)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		log.Fatal("etcd was not ready within 60 s")
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	case <-stop:
	}
}
