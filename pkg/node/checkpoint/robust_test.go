package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestBadUIDNeverTouchesPath: Get, Put and Delete refuse UIDs that are not
// one safe path element, so "../x" cannot read or remove a file outside
// the store (L1).
func TestBadUIDNeverTouchesPath(t *testing.T) {
	parent := t.TempDir()
	s, _ := Open(filepath.Join(parent, "claims"))
	victim := filepath.Join(parent, "victim.json")
	if err := os.WriteFile(victim, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []types.UID{"../victim", "a/b", "..", ""} {
		if _, err := s.Get(uid); err == nil {
			t.Errorf("Get(%q) accepted", uid)
		}
		if err := s.Delete(uid); err == nil {
			t.Errorf("Delete(%q) accepted", uid)
		}
		if err := s.Put(&Claim{UID: uid}); err == nil {
			t.Errorf("Put(%q) accepted", uid)
		}
		if _, err := s.Salvage(uid); err == nil {
			t.Errorf("Salvage(%q) accepted", uid)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatal("a file outside the store was removed")
	}
}

// TestSalvage: records Get refuses still yield their devices, so the
// driver can keep them reserved (M1).
func TestSalvage(t *testing.T) {
	s, _ := Open(t.TempDir())
	c := claim("a")
	c.Devices[0].MIG = &MIG{Profile: "1g.10gb", Start: 6, Size: 1, Created: true, GIID: 13, CIID: 0, UUID: "MIG-x"}
	body, _ := json.Marshal(c)
	var withFuture map[string]any
	if err := json.Unmarshal(body, &withFuture); err != nil {
		t.Fatal(err)
	}
	withFuture["futureField"] = "v2"
	futureBody, _ := json.Marshal(withFuture)
	for _, tc := range []struct {
		name string
		env  envelope
	}{
		{"future version no older build may read", envelope{Version: Version + 1, MinReader: Version + 1, Checksum: checksum(futureBody), Claim: futureBody}},
		{"future version of no declared reader (as format 1 wrote)", envelope{Version: Version + 1, Checksum: checksum(futureBody), Claim: futureBody}},
		{"bad checksum", envelope{Version: Version, Checksum: "0000", Claim: body}},
		{"unknown field", envelope{Version: Version, Checksum: checksum(futureBody), Claim: futureBody}},
	} {
		data, _ := json.Marshal(tc.env)
		if err := os.WriteFile(filepath.Join(s.Dir(), "a.json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get("a"); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Get: %v, want ErrCorrupt", tc.name, err)
		}
		got, err := s.Salvage("a")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(got.Devices) != 1 || got.Devices[0].GPUUUID != "GPU-1" || got.Devices[0].MIG.GIID != 13 {
			t.Errorf("%s: salvaged %+v", tc.name, got)
		}
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), "a.json"), []byte(`{"version":1,"claim":{"uid":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Salvage("a"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("truncated: %v", err)
	}
}

// FuzzDecode: the record decoder never panics, and what it accepts
// re-encodes to a record it accepts again, unchanged.
func FuzzDecode(f *testing.F) {
	c := claim("a")
	body, _ := json.Marshal(c)
	good, _ := json.Marshal(envelope{Version: Version, Checksum: checksum(body), Claim: body})
	f.Add(good)
	f.Add([]byte(`{"version":1,"checksum":"x","claim":{}}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`null`))
	f.Add([]byte(strings.Replace(string(good), `"gpu-0"`, `"gpu-1"`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = salvage(data) // ignored: it must only not panic
		c, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		body, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		again, err := json.Marshal(envelope{Version: Version, Checksum: checksum(body), Claim: body})
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Decode(again)
		if err != nil {
			t.Fatalf("re-encoded record refused: %v", err)
		}
		b2, _ := json.Marshal(c2)
		if string(b2) != string(body) {
			t.Fatalf("round trip changed the record:\n%s\n%s", body, b2)
		}
	})
}

// TestRollback: a build reads the records of a newer format that says it
// may (minReader), ignoring the fields it does not know, so that a
// rollback to it finds every claim the newer build prepared; and it still
// refuses an unknown field in a record of its own format (damage).
func TestRollback(t *testing.T) {
	s, _ := Open(t.TempDir())
	c := claim("a")
	body, _ := json.Marshal(c)
	var next map[string]any
	if err := json.Unmarshal(body, &next); err != nil {
		t.Fatal(err)
	}
	next["fieldOfTheNextMinor"] = map[string]any{"x": 1}
	nextBody, _ := json.Marshal(next)
	for _, tc := range []struct {
		name    string
		env     envelope
		wantErr bool
	}{
		{"the next format, readable by this one", envelope{Version: Version + 1, MinReader: Version, Checksum: checksum(nextBody), Claim: nextBody}, false},
		{"this format with a field it does not have", envelope{Version: Version, MinReader: Version, Checksum: checksum(nextBody), Claim: nextBody}, true},
		{"a minReader above its version", envelope{Version: Version, MinReader: Version + 1, Checksum: checksum(body), Claim: body}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, _ := json.Marshal(tc.env)
			if err := os.WriteFile(filepath.Join(s.Dir(), "a.json"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := s.Get("a")
			if tc.wantErr {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Get: %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil || got.UID != "a" || len(got.Devices) != 1 || got.Devices[0].GPUUUID != "GPU-1" {
				t.Fatalf("Get: %+v, %v; want the record, its unknown field ignored", got, err)
			}
		})
	}
	// What this build writes says any format-1 reader may read it.
	if err := s.Put(claim("b")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	data, err := os.ReadFile(filepath.Join(s.Dir(), "b.json"))
	if err != nil {
		t.Fatal(err)
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil || env.Version != Version || env.MinReader != MinReader {
		t.Fatalf("written envelope %+v (%v), want version %d, minReader %d", env, err, Version, MinReader)
	}
}

// TestMIGProfileInfoIDIsOptional: a format-1 record carries the GI profile
// ID nvidia-smi shows beside NVML's index, and reads back with it; one
// written before the field existed reads too, without it, not as profile
// ID 0 (a 7g).
func TestMIGProfileInfoIDIsOptional(t *testing.T) {
	nineteen := 19
	for _, tc := range []struct {
		name string
		mig  string
		want *int
	}{
		{"with the nvidia-smi ID", `{"profile":"1g.10gb","giProfileID":0,"giProfileInfoID":19,"ciProfileID":0,"start":6,"size":1,"created":false,"giID":0,"ciID":0}`, &nineteen},
		{"from before it", `{"profile":"1g.10gb","giProfileID":0,"ciProfileID":0,"start":6,"size":1,"created":false,"giID":0,"ciID":0}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := Open(t.TempDir())
			body := []byte(`{"uid":"a","namespace":"ns","name":"a","state":"Preparing","devices":[{"requests":["r"],"pool":"p","device":"gpu-0-mig-1g10gb-6","gpuUUID":"GPU-a","cdiDeviceIDs":[],"kind":"mig","mig":` + tc.mig + `}]}`)
			data, _ := json.Marshal(envelope{Version: Version, MinReader: MinReader, Checksum: checksum(body), Claim: body})
			if err := os.WriteFile(filepath.Join(s.Dir(), "a.json"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := s.Get("a")
			if err != nil {
				t.Fatal(err)
			}
			m := got.Devices[0].MIG
			if (m.GIProfileInfoID == nil) != (tc.want == nil) || (tc.want != nil && *m.GIProfileInfoID != *tc.want) || m.GIProfileID != 0 {
				t.Fatalf("read GI profile index %d, ID %v; want 0, %v", m.GIProfileID, m.GIProfileInfoID, tc.want)
			}
			// Written again, it keeps what it had.
			if err := s.Put(got); err != nil {
				t.Fatal(err)
			}
			again, err := s.Get("a")
			if err != nil || !reflect.DeepEqual(again.Devices[0].MIG, m) {
				t.Fatalf("after Put: %+v, %v; want %+v", again.Devices[0].MIG, err, m)
			}
		})
	}
}

// TestComputeDomainRecords: format 2's IMEX channel records. A channel
// claim's record carries its domain and says only format 2 may read it
// (a format-1 build would unprepare it and leave the node's label); every
// other record still says format 1 may, so a rollback to a format-1 build
// reads the GPU claims. A format-1 record reads here as it was.
func TestComputeDomainRecords(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	ch := &Claim{UID: "ch", Namespace: "ns", Name: "train-channel-x", State: StatePreparing,
		Devices:       []Device{{Requests: []string{"channel"}, Pool: "node", Device: "imex-channel", Kind: "imex-channel"}},
		ComputeDomain: &ComputeDomain{UID: "4b1f", Namespace: "ns", Name: "train"}}
	for _, c := range []*Claim{ch, claim("gpu")} {
		if err := s.Put(c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Get("ch")
	if err != nil || got.ComputeDomain == nil || *got.ComputeDomain != *ch.ComputeDomain {
		t.Fatalf("Get(ch) = %+v, %v", got, err)
	}
	s.Close()
	for uid, want := range map[string]int{"ch": MinReaderComputeDomain, "gpu": MinReader} {
		data, err := os.ReadFile(filepath.Join(dir, uid+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var env envelope
		if err := json.Unmarshal(data, &env); err != nil || env.Version != Version || env.MinReader != want {
			t.Errorf("%s: envelope %+v (%v), want version %d, minReader %d", uid, env, err, Version, want)
		}
	}
	if MinReaderComputeDomain != 2 || MinReader != 1 || Version != 2 {
		t.Errorf("format %d, minReader %d and %d for channel records: the upgrade and rollback notes (docs/guarantees.md) say 2, 1 and 2", Version, MinReader, MinReaderComputeDomain)
	}

	// A record format 1 wrote (before the field existed).
	body := []byte(`{"uid":"old","namespace":"ns","name":"old","state":"Prepared","cdiSpec":"spec.json","devices":[{"requests":["gpu"],"pool":"node","device":"gpu-0","gpuUUID":"GPU-1","cdiDeviceIDs":["x"],"kind":"gpu"}]}`)
	data, _ := json.Marshal(envelope{Version: 1, MinReader: 1, Checksum: checksum(body), Claim: body})
	if err := os.WriteFile(filepath.Join(dir, "old.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ = Open(dir)
	defer s.Close()
	old, err := s.Get("old")
	if err != nil || old.ComputeDomain != nil || old.Devices[0].GPUUUID != "GPU-1" {
		t.Fatalf("format-1 record: %+v, %v", old, err)
	}
}
