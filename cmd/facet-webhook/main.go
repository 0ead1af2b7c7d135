// Command facet-webhook is Facet's admission webhook. It refuses
// ResourceClaims, ResourceClaimTemplates and DeviceClasses whose opaque
// config for gpu.facet.dev the kubelet plugin would refuse (see
// pkg/cluster/webhook), and with --mutate-pods it rewrites pods that ask for
// extended resources (nvidia.com/gpu, nvidia.com/mig-<profile>, HAMi's and
// Volcano's vGPUs) into DRA claims where the cluster does not map them
// itself. With --mutate-claims it writes the plain MIG requests of new
// claims and templates as the existing-first prioritized list. It serves
// HTTPS only; the certificate and key files are re-read when they change.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cluster/webhook"
	"github.com/facet-gpu/facet/pkg/daemon"
)

// flags are the webhook's settings besides its server's.
type flags struct {
	mutatePods, mutateClaims, preferMIG bool
	kube                                daemon.Kube
	mapFile, mode, kueue, namespace     string
	recheck                             time.Duration
}

func main() {
	var f flags
	var opts webhook.ServerOptions
	addFlags := func(fs *flag.FlagSet) {
		fs.StringVar(&opts.Address, "bind-address", ":8443", "address to serve HTTPS on")
		fs.StringVar(&opts.CertFile, "tls-cert-file", "", "serving certificate (PEM), re-read when it changes; required")
		fs.StringVar(&opts.KeyFile, "tls-private-key-file", "", "serving certificate's private key (PEM), re-read when it changes; required")
		fs.DurationVar(&opts.ReloadInterval, "tls-reload-interval", time.Second, "how often, at most, to look for a new certificate (on a TLS handshake)")
		fs.StringVar(&opts.MetricsAddr, "metrics-addr", "", "address for /metrics (the serving certificate's expiry and failed reloads) and /healthz over plain HTTP; empty: none")
		fs.BoolVar(&f.mutatePods, "mutate-pods", false, "serve "+webhook.MutatePath+", which rewrites pods' extended resources into DRA claims (needs API access)")
		fs.BoolVar(&f.mutateClaims, "mutate-claims", false, "serve "+webhook.MutateClaimsPath+", which writes the plain MIG requests of new ResourceClaims and ResourceClaimTemplates as a prioritized list, existing instances first (needs API access: it probes for firstAvailable and Kueue; never with Kueue)")
		fs.StringVar(&f.mode, "mutate-extended-resources", string(webhook.RewriteAuto),
			"when "+webhook.MutatePath+" rewrites pods: auto (per resource: those no DeviceClass maps in spec.extendedResourceName, which the API server keeps only with DRAExtendedResource; so every mapped one where the gate is off, and vGPU sizes where it is on), always, never")
		fs.StringVar(&f.kueue, "kueue", string(webhook.KueueOff),
			"write claims Kueue's deviceClassMappings can count (docs/kueue.md): on (vGPU sizes become claims of the sized DeviceClasses of facetctl classes, with no CEL and no config, and pods are rewritten whatever DRAExtendedResource), off, or auto (on while the API server serves kueue.x-k8s.io); "+webhook.MutateClaimsPath+" leaves claims alone with on, and wherever kueue.x-k8s.io is served")
		fs.BoolVar(&f.preferMIG, "prefer-existing-mig", true, "write a pod's MIG claim as a prioritized list: an instance that exists (static-mig), then a carve on a GPU already in MIG use, then any carve (where the API server keeps firstAvailable, DRAPrioritizedList; not in Kueue mode)")
		fs.StringVar(&f.namespace, "namespace", "default", "the webhook's own namespace, where it dry-runs the claims that tell whether the API server keeps firstAvailable (needs create on resourceclaims there)")
		fs.StringVar(&f.mapFile, "extended-resource-map", "", "YAML or JSON file of the extended resources to rewrite and their DeviceClasses; default: the built-in table (see pkg/cluster/webhook DefaultExtendedResourceMap)")
		fs.DurationVar(&f.recheck, "extended-resource-recheck-interval", time.Minute, "how often to re-check, and log a change of, whether pods are rewritten and whether the API server keeps firstAvailable")
		f.kube.AddFlags(fs)
	}
	daemon.Main("facet-webhook", addFlags, func(ctx context.Context) error {
		return run(ctx, opts, f)
	})
}

func run(ctx context.Context, opts webhook.ServerOptions, f flags) error {
	if !f.mutatePods && !f.mutateClaims {
		return webhook.Serve(ctx, opts)
	}
	logger := klog.FromContext(ctx)
	// Every setting is checked before the API is asked anything.
	km, err := webhook.ParseKueueMode(f.kueue)
	if err != nil {
		return fmt.Errorf("--kueue: %w", err)
	}
	m, err := webhook.ParseRewriteMode(f.mode)
	if err != nil {
		return fmt.Errorf("--mutate-extended-resources: %w", err)
	}
	table := webhook.DefaultExtendedResourceMap()
	if f.mutatePods && f.mapFile != "" {
		if table, err = webhook.LoadExtendedResourceMap(f.mapFile); err != nil {
			return err
		}
	}
	f.kube.UserAgent = "facet-webhook"
	client, err := f.kube.Client()
	if err != nil {
		return fmt.Errorf("--mutate-pods, --mutate-claims: %w", err)
	}
	// Asked once before serving, so that the first pods and claims are
	// written as the cluster allows; a failure is logged and leaves MIG
	// requests as written until a later probe answers.
	probe := webhook.NewPrioritizedListProbe(logger.WithName("prioritized-list"), client, f.namespace)
	probe.Check(ctx)
	go probe.Run(ctx, f.recheck)

	if f.mutateClaims {
		claims, err := webhook.NewClaimMutator(logger.WithName("mutate-claims"), webhook.ClaimMutatorOptions{
			Kueue: km, Discovery: client.Discovery(), PrioritizedList: probe,
		})
		if err != nil {
			return err
		}
		opts.ClaimMutator = claims
	}
	if !f.mutatePods {
		return webhook.Serve(ctx, opts)
	}

	// An informer, not a GET per pod: every pod needs the classes, and a
	// change of gate shows in them without polling.
	factory := informers.NewSharedInformerFactory(client, 10*time.Minute)
	classes := factory.Resource().V1().DeviceClasses()
	lister := classes.Lister()
	informer := classes.Informer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	syncCtx, cancelSync := context.WithTimeout(ctx, time.Minute)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), informer.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("the DeviceClass informer did not sync in a minute; the webhook needs get, list and watch on deviceclasses.resource.k8s.io")
	}

	mutator, err := webhook.NewMutator(logger.WithName("mutate-pods"), webhook.MutatorOptions{
		Map: table, RewriteMode: m, Classes: lister, Client: client, Kueue: km,
		PreferExistingMIG: f.preferMIG, PrioritizedList: probe,
	})
	if err != nil {
		return err
	}
	go mutator.Run(ctx, f.recheck)
	opts.Mutator = mutator
	return webhook.Serve(ctx, opts)
}
