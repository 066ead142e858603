// podresources-list: the kubelet's PodResources List (and GetAllocatableResources) answer as
// protobuf JSON, through the kubelet's own generated client, for recording what the real
// kubelet reports (make k8s-test keeps it as a fixture of kata-topo's unit tests).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func main() {
	socket := flag.String("socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's PodResources socket")
	allocatable := flag.Bool("allocatable", false, "GetAllocatableResources instead of List")
	timeout := flag.Duration("timeout", 10*time.Second, "the deadline of the call")
	flag.Parse()
	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("%s: %v", *socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	marshal := protojson.MarshalOptions{Multiline: true, Indent: "  "}
	var out []byte
	if *allocatable {
		resp, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
		if err != nil {
			log.Fatalf("GetAllocatableResources: %v", err)
		}
		out, err = marshal.Marshal(resp)
		if err != nil {
			log.Fatal(err)
		}
	} else {
		resp, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			log.Fatalf("List: %v", err)
		}
		out, err = marshal.Marshal(resp)
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Fprintln(os.Stdout, string(out))
}
