// Package promrules checks the chart's alerts and dashboard
// (deployments/helm/facet/files) against Prometheus itself: every
// expression parses with Prometheus's own parser and names only series that
// Facet's binaries export (read from their source) or dcgm-exporter's, and
// the alerts pass their unit tests in Prometheus's rule-test format
// (testdata/rules_test.yaml, run by promtool). A module of its own, so that
// Prometheus's dependencies stay out of Facet's go.mod.
package promrules

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	promparser "github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

var root = filepath.Join("..", "..")

// exported are the metric names Facet's binaries register, read from the
// source: prometheus.*Opts{Namespace, Subsystem, Name} and NewDesc("...")
// with the package's namespace constant. Histograms add _bucket, _sum and
// _count.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range []string{"pkg/node/nodemetrics/metrics.go", "pkg/cluster/preempt/controller/metrics.go", "pkg/cluster/computedomain/metrics.go", "pkg/cluster/webhook/metrics.go"} {
		file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, f), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		consts := map[string]string{}
		ast.Inspect(file, func(n ast.Node) bool {
			if v, ok := n.(*ast.ValueSpec); ok {
				for i, name := range v.Names {
					if i < len(v.Values) {
						if lit, ok := v.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[name.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
			return true
		})
		str := func(e ast.Expr) string {
			switch x := e.(type) {
			case *ast.BasicLit:
				s, _ := strconv.Unquote(x.Value)
				return s
			case *ast.Ident:
				return consts[x.Name]
			case *ast.BinaryExpr:
				l, r := "", ""
				if a, ok := x.X.(*ast.Ident); ok {
					l = consts[a.Name]
				} else if a, ok := x.X.(*ast.BasicLit); ok {
					l, _ = strconv.Unquote(a.Value)
				}
				if b, ok := x.Y.(*ast.BasicLit); ok {
					r, _ = strconv.Unquote(b.Value)
				}
				return l + r
			}
			return ""
		}
		// Constructors that take a metric's name (histogramVec(name, ...),
		// or counter(name, ...) through opts(name, ...)): the name's prefix
		// from their Opts literal, and whether it is a histogram.
		type ctor struct {
			prefix string
			hist   bool
		}
		ctors := map[string]ctor{}
		optsPrefix := func(x *ast.CompositeLit) (string, bool) {
			var parts []string
			byName := false
			for _, el := range x.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				k, ok := kv.Key.(*ast.Ident)
				if !ok {
					continue
				}
				switch k.Name {
				case "Namespace", "Subsystem":
					if v := str(kv.Value); v != "" {
						parts = append(parts, v)
					}
				case "Name":
					if id, ok := kv.Value.(*ast.Ident); ok && id.Name == "name" {
						byName = true
					}
				}
			}
			return strings.Join(parts, "_"), byName
		}
		for range 2 { // constructors that call constructors
			for _, d := range file.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil || fd.Recv != nil {
					continue
				}
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					switch x := n.(type) {
					case *ast.CompositeLit:
						if sel, ok := x.Type.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "Opts") {
							if prefix, byName := optsPrefix(x); byName {
								ctors[fd.Name.Name] = ctor{prefix: prefix, hist: sel.Sel.Name == "HistogramOpts"}
							}
						}
					case *ast.CallExpr:
						if id, ok := x.Fun.(*ast.Ident); ok && len(x.Args) > 0 {
							if arg, ok := x.Args[0].(*ast.Ident); ok && arg.Name == "name" {
								if c, ok := ctors[id.Name]; ok {
									if _, seen := ctors[fd.Name.Name]; !seen {
										ctors[fd.Name.Name] = c
									}
								}
							}
						}
					}
					return true
				})
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if id, ok := call.Fun.(*ast.Ident); ok && len(call.Args) > 0 {
					if c, ok := ctors[id.Name]; ok {
						if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							name, _ := strconv.Unquote(lit.Value)
							full := c.prefix + "_" + name
							out[full] = true
							if c.hist {
								for _, s := range []string{"_bucket", "_sum", "_count"} {
									out[full+s] = true
								}
							}
						}
					}
				}
			}
			return true
		})
		ast.Inspect(file, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.CompositeLit:
				sel, ok := x.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				parts := map[string]string{}
				for _, el := range x.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok {
							parts[k.Name] = str(kv.Value)
						}
					}
				}
				var name []string
				for _, k := range []string{"Namespace", "Subsystem", "Name"} {
					if parts[k] != "" {
						name = append(name, parts[k])
					}
				}
				full := strings.Join(name, "_")
				out[full] = true
				if sel.Sel.Name == "HistogramOpts" {
					for _, s := range []string{"_bucket", "_sum", "_count"} {
						out[full+s] = true
					}
				}
			case *ast.CallExpr:
				if sel, ok := x.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewDesc" && len(x.Args) > 0 {
					out[str(x.Args[0])] = true
				}
			}
			return true
		})
	}
	delete(out, "")
	if !out["facet_gpu_healthy"] || !out["facet_prepare_errors_total"] || !out["facet_preemptor_preemptions_total"] {
		t.Fatalf("reading the metric names from the source found %d, not the known ones: has the registration changed?", len(out))
	}
	return out
}

// dcgm are dcgm-exporter's series the dashboard may join to Facet's by
// UUID (dcgm-exporter etc/default-counters.csv).
var dcgm = map[string]bool{"DCGM_FI_DEV_GPU_UTIL": true, "DCGM_FI_DEV_FB_USED": true, "DCGM_FI_DEV_FB_FREE": true}

// expressions are the chart's PromQL expressions: each alert's, and each
// dashboard target's (with Grafana's $node variable and range made
// concrete), by where they come from.
func expressions(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	raw, err := os.ReadFile(filepath.Join(root, "deployments/helm/facet/files/prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct{ Alert, Record, Expr string }
		}
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["rule "+g.Name+"/"+r.Alert+r.Record] = r.Expr
		}
	}
	raw, err = os.ReadFile(filepath.Join(root, "deployments/helm/facet/files/grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var board struct {
		Panels []struct {
			Title   string
			Targets []struct{ RefID, Expr string }
		}
	}
	if err := json.Unmarshal(raw, &board); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$node", ".*", "$__rate_interval", "5m")
	for _, p := range board.Panels {
		for _, tg := range p.Targets {
			out["panel "+p.Title+"/"+tg.RefID] = vars.Replace(tg.Expr)
		}
	}
	if len(out) < 10 {
		t.Fatalf("found %d expressions", len(out))
	}
	return out
}

// TestExpressions: each parses, and each series it names is Facet's or
// dcgm-exporter's.
func TestExpressions(t *testing.T) {
	known := exported(t)
	var names []string
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("%d series exported: %s", len(names), strings.Join(names, " "))
	for where, expr := range expressions(t) {
		e, err := promparser.NewParser(promparser.Options{}).ParseExpr(expr)
		if err != nil {
			t.Errorf("%s: %v\n%s", where, err, expr)
			continue
		}
		promparser.Inspect(e, func(n promparser.Node, _ []promparser.Node) error {
			if vs, ok := n.(*promparser.VectorSelector); ok && vs.Name != "" && !known[vs.Name] && !dcgm[vs.Name] {
				t.Errorf("%s: series %s is not one Facet or dcgm-exporter exports", where, vs.Name)
			}
			return nil
		})
	}
}

var promtoolVersion = regexp.MustCompile(`promtool, version`)

// TestRules runs the alerts' unit tests (testdata/rules_test.yaml) with the
// promtool that $FACET_PROMTOOL names: make unit builds it, as a stage of its
// own, from the Prometheus release this module pins (go.mod's tool line)
// into the tools cache. The test never builds it: under the e2e rounds' load
// a build here once ran past go test's 10-minute limit.
func TestRules(t *testing.T) {
	if testing.Short() {
		t.Skip("runs promtool")
	}
	promtool := os.Getenv("FACET_PROMTOOL")
	if promtool == "" {
		t.Fatal("FACET_PROMTOOL is not set: run `make promtool-tool` and set it to the binary that make prints, or run `make unit`")
	}
	if out, err := exec.Command(promtool, "--version").CombinedOutput(); err != nil || !promtoolVersion.Match(out) {
		t.Fatalf("%s --version: %v\n%s", promtool, err, out)
	}
	out, err := exec.Command(promtool, "test", "rules", filepath.Join("testdata", "rules_test.yaml")).CombinedOutput()
	t.Logf("promtool test rules:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
