// Command chartinstall installs, upgrades or uninstalls a chart directory
// through Helm's action package (helm.sh/helm/v3), like `helm upgrade
// --install --wait` and `helm uninstall`, for `make demo`, which has no helm
// binary: the helm CLI's own module needs dependencies this module does not
// carry.
//
//	chartinstall upgrade RELEASE CHART_DIR -n NAMESPACE [-f values.yaml]... [--timeout 3m]
//	chartinstall uninstall RELEASE -n NAMESPACE
//
// It uses $KUBECONFIG, and creates the namespace if it is missing.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

type valueFiles []string

func (v *valueFiles) String() string     { return fmt.Sprint(*v) }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chartinstall:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: chartinstall upgrade RELEASE CHART_DIR -n NS [-f values.yaml]... | uninstall RELEASE -n NS")
	}
	verb, release := args[0], args[1]
	fs := flag.NewFlagSet("chartinstall "+verb, flag.ContinueOnError)
	ns := fs.String("n", "default", "namespace of the release")
	timeout := fs.Duration("timeout", 3*time.Minute, "how long to wait for the release's resources to be ready")
	var files valueFiles
	fs.Var(&files, "f", "values file (repeatable; later ones win)")
	rest := args[2:]
	chartDir := ""
	if verb == "upgrade" {
		if len(rest) == 0 {
			return errors.New("upgrade needs CHART_DIR")
		}
		chartDir, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}

	kubeconfig := os.Getenv("KUBECONFIG")
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig, getter.Namespace = &kubeconfig, ns
	cfg := new(action.Configuration)
	if err := cfg.Init(getter, *ns, "secret", func(format string, v ...any) { fmt.Printf(format+"\n", v...) }); err != nil {
		return err
	}

	switch verb {
	case "uninstall":
		_, err := action.NewUninstall(cfg).Run(release)
		if errors.Is(err, driver.ErrReleaseNotFound) {
			return nil
		}
		return err
	case "upgrade":
		ch, err := loader.Load(chartDir)
		if err != nil {
			return err
		}
		vals := map[string]any{}
		for _, f := range files {
			v, err := chartutil.ReadValuesFile(f)
			if err != nil {
				return err
			}
			vals = chartutil.CoalesceTables(v, vals)
		}
		if _, err := action.NewHistory(cfg).Run(release); errors.Is(err, driver.ErrReleaseNotFound) {
			in := action.NewInstall(cfg)
			in.ReleaseName, in.Namespace, in.CreateNamespace, in.Wait, in.Timeout = release, *ns, true, true, *timeout
			rel, err := in.Run(ch, vals)
			if err != nil {
				return err
			}
			fmt.Printf("installed release %s (revision %d) in %s: %s\n", rel.Name, rel.Version, *ns, rel.Info.Status)
			return nil
		}
		up := action.NewUpgrade(cfg)
		up.Namespace, up.Wait, up.Timeout = *ns, true, *timeout
		rel, err := up.Run(release, ch, vals)
		if err != nil {
			return err
		}
		fmt.Printf("upgraded release %s to revision %d in %s: %s\n", rel.Name, rel.Version, *ns, rel.Info.Status)
		return nil
	}
	return fmt.Errorf("unknown command %q", verb)
}
