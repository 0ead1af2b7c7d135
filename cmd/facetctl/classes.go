package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/pkg/cluster/classes"
	"github.com/facet-gpu/facet/pkg/cluster/fit"
)

// runClasses prints the DeviceClasses a quota system such as Kueue counts
// by name (pkg/cluster/classes), for the shapes the nodes publish.
func runClasses(args []string) error {
	fs := flag.NewFlagSet("classes", flag.ExitOnError)
	kube := kubeFlag(fs)
	file := fs.String("slices", "", "read the ResourceSlices from this YAML file (e.g. `facetctl slices` output, or - for stdin) instead of a cluster")
	sizes := fs.String("share-sizes", "", `vGPU share sizes to make classes for, MEMORY/PERCENT joined by ",", e.g. "2000Mi/20,10Gi/50"`)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "facetctl classes [--slices FILE | --kubeconfig FILE] [--share-sizes 2000Mi/20,...]\n\n"+
			"Prints, for kubectl apply -f -, one DeviceClass per whole-GPU product family (gpu-<family>.facet.dev),\n"+
			"MIG profile (mig-<profile>.facet.dev), vGPU slot size (vgpu-slot-<MiB>mi-<cores>.facet.dev) and\n"+
			"vGPU share size (vgpu-<MiB>mi-<cores>.facet.dev) the nodes publish, so that claims name only a class\n"+
			"and Kueue's deviceClassMappings can count them (docs/kueue.md).\n\n")
		fs.PrintDefaults()
	}
	fs.Parse(args)
	shareSizes, err := classes.ParseSizes(*sizes)
	if err != nil {
		return fmt.Errorf("--share-sizes: %w", err)
	}
	var in []*resourceapi.ResourceSlice
	if *file != "" {
		r, err := openInput(*file)
		if err != nil {
			return err
		}
		defer r.Close()
		if in, _, _, err = fit.ReadObjects(r); err != nil {
			return fmt.Errorf("--slices %s: %w", *file, err)
		}
	} else {
		client, err := kube.Client()
		if err != nil {
			return err
		}
		list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list ResourceSlices: %w", err)
		}
		for i := range list.Items {
			in = append(in, &list.Items[i])
		}
	}
	res, err := classes.Generate(in, classes.Options{ShareSizes: shareSizes})
	if err != nil {
		return err
	}
	return classes.WriteYAML(os.Stdout, res)
}
