package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/features"
)

func runFit(args []string) error {
	fs := flag.NewFlagSet("fit", flag.ExitOnError)
	kube := kubeFlag(fs)
	file := fs.String("f", "", "YAML file with a ResourceClaim, a ResourceClaimTemplate, or a Pod and its templates, - for standard input (required)")
	node := fs.String("node", "", "try only this node (default: every node with Facet GPUs)")
	gates := fs.String("feature-gates", "", "the kube-scheduler's DRA gates where they differ from what the API server enforces (DRAPartitionableDevices=true,...); applied over detection")
	fs.Parse(args)
	if *file == "" {
		return fmt.Errorf("-f is required")
	}
	ctx := context.Background()
	data, err := openInput(*file)
	if err != nil {
		return err
	}
	defer data.Close()
	stream, err := fit.Decode(data)
	if err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	client, dyn, err := kube.Clients()
	if err != nil {
		return err
	}

	var claims []*resourceapi.ResourceClaim
	switch {
	case len(stream.Pods) > 1:
		return fmt.Errorf("%s: %d pods; fit asks about one pod at a time", *file, len(stream.Pods))
	case len(stream.Pods) == 1:
		pod := stream.Pods[0]
		if pod.Namespace == "" {
			pod.Namespace = "default"
		}
		var missing []string
		// A template not in the file is the cluster's: a ComputeDomain's
		// channel template is written by facet-controller.
		if claims, missing, err = stream.PodClaimsWith(pod, fit.Template(ctx, client)); err != nil {
			return err
		}
		for _, name := range missing {
			c, err := fit.Claim(ctx, client, pod.Namespace, name)
			if err != nil {
				return fmt.Errorf("pod %s: %w", pod.Name, err)
			}
			claims = append(claims, c)
		}
	default:
		claims = stream.Claims
		for _, t := range stream.Templates {
			claims = append(claims, fit.FromTemplate(t, t.Name))
		}
	}
	if len(claims) == 0 {
		return fmt.Errorf("%s: no ResourceClaim, ResourceClaimTemplate or Pod with resourceClaims", *file)
	}
	for _, c := range claims {
		if c.Namespace == "" {
			c.Namespace = "default"
		}
	}

	in, err := fit.Live(ctx, client, *node)
	if err != nil {
		return err
	}
	if in.Domains, err = occupancy.ReadDomains(ctx, dyn); err != nil {
		return err
	}
	// The allocator runs with the cluster's own DRA features: a mode the
	// scheduler does not enforce would otherwise fit here and not there.
	set, err := features.Detect(ctx, client, "facetctl-probe")
	if err != nil {
		if *gates == "" {
			return fmt.Errorf("detect the cluster's DRA features (pass --feature-gates to name them instead): %w", err)
		}
		set = features.Stock("not detected: " + err.Error())
	}
	if *gates != "" {
		o, err := features.ParseOverrides(*gates)
		if err != nil {
			return err
		}
		set = set.Apply(o)
	}
	in.Features = fit.FeaturesOf(set)
	fmt.Printf("cluster %s, allocator features: %s\n", set.ServerVersion, set)
	results, err := fit.Check(ctx, in, *node, claims)
	if err != nil {
		return err
	}
	fit.Write(os.Stdout, results)
	for _, r := range results {
		if r.Fits {
			return nil
		}
	}
	// A pod of a ComputeDomain: where its domain stands.
	notes, err := fit.DomainNotes(in, claims)
	if err != nil {
		return err
	}
	if len(notes) > 0 {
		fmt.Println("\ncompute domains:")
		for _, n := range notes {
			fmt.Println("  " + n)
		}
	}
	return errNoFit
}

// errNoFit makes facetctl exit with code 3: the claim fits nowhere, which
// scripts must tell apart from an error (code 1).
var errNoFit = errors.New("the claim fits on no node")
