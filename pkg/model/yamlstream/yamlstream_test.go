package yamlstream

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type obj struct {
	metav1.ObjectMeta `json:"metadata"`
	Value             int     `json:"value"`
	Bad               float64 `json:"bad,omitempty"`
}

func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name    string
		docs    []Doc
		want    string
		wantErr string
	}{
		{name: "empty", want: ""},
		{
			name: "two, a comment on the second, no creationTimestamp",
			docs: []Doc{{Object: obj{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Value: 1}, Name: "obj a"}, {Object: obj{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Value: 2}, Name: "obj b", Comment: "why b\nis so"}},
			want: "metadata:\n  name: a\nvalue: 1\n---\n# why b\n# is so\nmetadata:\n  name: b\nvalue: 2\n",
		},
		{
			name:    "a document that cannot be marshalled names it, and nothing is written",
			docs:    []Doc{{Object: obj{Value: 1}, Name: "obj a"}, {Object: map[string]any{"f": func() {}}, Name: "obj f"}},
			wantErr: "marshal obj f",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			err := Write(&b, tc.docs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || b.Len() != 0 {
					t.Fatalf("error %v, output %q; want %q and nothing written", err, b.String(), tc.wantErr)
				}
				return
			}
			if err != nil || b.String() != tc.want {
				t.Fatalf("got %q, %v; want %q", b.String(), err, tc.want)
			}
		})
	}
}
