package helm

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// rbacRows are the chart's RBAC rules, every role rendered with the opt-in
// parts on, as rows of the chart README's RBAC table:
// "| component | kind | API group | resources | names | verbs |".
func rbacRows(t *testing.T) []string {
	t.Helper()
	objs := render(t, values(t, "preemptor: {enabled: true}\nadmission: {webhook: {mutatePods: {enabled: true}}}"))
	var rows []string
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range ofKind(objs, kind) {
			var rules []rbacv1.PolicyRule
			if kind == "ClusterRole" {
				r := &rbacv1.ClusterRole{}
				into(t, o, r)
				rules = r.Rules
			} else {
				r := &rbacv1.Role{}
				into(t, o, r)
				rules = r.Rules
			}
			for _, r := range rules {
				groups := make([]string, len(r.APIGroups))
				for i, g := range r.APIGroups {
					if g == "" {
						g = "core"
					}
					groups[i] = "`" + g + "`"
				}
				names := "any"
				if len(r.ResourceNames) > 0 {
					names = "`" + strings.Join(r.ResourceNames, "`, `") + "`"
				}
				resources := "`" + strings.Join(r.Resources, "`, `") + "`"
				if len(r.NonResourceURLs) > 0 {
					groups, resources = []string{"(URL)"}, "`"+strings.Join(r.NonResourceURLs, "`, `")+"`"
				}
				rows = append(rows, "| "+strings.Join([]string{
					o.GetLabels()["app.kubernetes.io/component"], kind, strings.Join(groups, ", "),
					resources, names, strings.Join(r.Verbs, ", "),
				}, " | ")+" |")
			}
		}
	}
	sort.Strings(rows)
	return rows
}

// TestReadmeRBAC: the chart README's RBAC table is every rule of every role
// the chart renders, no more, no less; on a mismatch it prints the table.
func TestReadmeRBAC(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const head = "| component | kind | API group | resources | names | verbs |"
	i := strings.Index(string(b), head)
	if i < 0 {
		t.Fatalf("the chart README has no RBAC table (%s)", head)
	}
	table, _, _ := strings.Cut(string(b[i:]), "\n\n")
	var got []string
	for _, l := range strings.Split(table, "\n")[2:] {
		got = append(got, strings.TrimSpace(l))
	}
	sort.Strings(got)
	want := rbacRows(t)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the chart README's RBAC table differs from the rendered roles; want:\n%s\n%s\n%s", head, "|---|---|---|---|---|---|", strings.Join(want, "\n"))
	}
}
