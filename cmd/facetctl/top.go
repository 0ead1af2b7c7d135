package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/pkg/cluster/top"
)

// pluginPods selects the chart's kubelet plugin pods.
const pluginPods = "app.kubernetes.io/component=kubelet-plugin"

// multiFlag collects a repeated string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runTop(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("top", flag.ExitOnError)
	kube := kubeFlag(fs)
	namespace := fs.String("namespace", "", "only the claims of this namespace")
	node := fs.String("node", "", "only this node's plugin")
	pluginNS := fs.String("plugin-namespace", "", "the kubelet plugin pods' namespace (default: all)")
	var urls multiFlag
	fs.Var(&urls, "metrics-url", "scrape this plugin /metrics URL directly instead of the cluster's plugin pods (repeatable; the node column shows the URL), e.g. for a plugin outside a pod")
	fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	type scrape struct {
		node string
		body []byte
	}
	var scrapes []scrape
	if len(urls) > 0 {
		for _, u := range urls {
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(u)
			if err != nil {
				return err
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s %v", u, resp.Status, err)
			}
			scrapes = append(scrapes, scrape{u, body})
		}
	} else {
		client, err := kube.Client()
		if err != nil {
			return err
		}
		pods, err := client.CoreV1().Pods(*pluginNS).List(ctx, metav1.ListOptions{LabelSelector: pluginPods})
		if err != nil {
			return fmt.Errorf("list the kubelet plugin pods (%s): %w", pluginPods, err)
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || (*node != "" && p.Spec.NodeName != *node) {
				continue
			}
			port := healthPort(&p)
			if port == 0 {
				fmt.Fprintf(os.Stderr, "facetctl top: %s/%s on %s serves /metrics on no port (hostNetwork: a unix socket in the pod); skipped\n", p.Namespace, p.Name, p.Spec.NodeName)
				continue
			}
			// Through the API server's pod proxy: no route to the pod
			// network is needed, only get on pods/proxy.
			body, err := client.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, fmt.Sprint(port), "/metrics", nil).DoRaw(ctx)
			if err != nil {
				return fmt.Errorf("scrape %s/%s on %s through the API server: %w", p.Namespace, p.Name, p.Spec.NodeName, err)
			}
			scrapes = append(scrapes, scrape{p.Spec.NodeName, body})
		}
	}
	var rows []top.Row
	for _, s := range scrapes {
		r, err := top.Parse(s.node, bytes.NewReader(s.body))
		if err != nil {
			return err
		}
		for _, row := range r {
			if *namespace == "" || row.Namespace == *namespace {
				rows = append(rows, row)
			}
		}
	}
	top.Write(out, rows)
	return nil
}

// healthPort is the plugin container's port named "health" (where the
// chart serves /metrics), 0 without one.
func healthPort(p *corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "health" {
				return port.ContainerPort
			}
		}
	}
	return 0
}
