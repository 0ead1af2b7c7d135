package names

import "testing"

type color string

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{in: "red", want: "red"},
		{in: "blue", want: "blue"},
		{in: "Red", wantErr: `unknown color "Red" (known: red, blue)`},
		{in: "", wantErr: `unknown color "" (known: red, blue)`},
	} {
		got, err := Parse(tc.in, "color", color("red"), color("blue"))
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr || got != "" {
				t.Errorf("Parse(%q) = %q, %v; want the error %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("Parse(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
