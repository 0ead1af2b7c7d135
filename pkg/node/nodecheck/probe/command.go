package probe

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"syscall"
	"time"
)

// Output is what Command writes to its standard output: the result, with
// what was measured before a failure, and the failure.
type Output struct {
	Result Result `json:"result"`
	Error  string `json:"error,omitempty"`
}

// Command is the probe's process: it loads --libcuda, runs the probe with
// --params (Params as JSON) and writes an Output as JSON to stdout. Its
// environment is the claim's (the caller sets it). It returns an error
// only for bad arguments; a CUDA failure is in the Output.
func Command(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	lib := fs.String("libcuda", "libcuda.so.1", "the CUDA driver library to dlopen")
	params := fs.String("params", "{}", "what to measure: Params as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var p Params
	if err := json.Unmarshal([]byte(*params), &p); err != nil {
		return fmt.Errorf("--params: %w", err)
	}
	for _, b := range p.Binds {
		if err := syscall.Mount(b.Host, b.Container, "", syscall.MS_BIND, ""); err != nil {
			return json.NewEncoder(stdout).Encode(Output{Error: fmt.Sprintf("bind %s over %s, as the claim's container has it: %v", b.Host, b.Container, err)})
		}
	}
	// A CUDA context is current on one OS thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var out Output
	d, err := Open(*lib)
	if err == nil {
		out.Result, err = Run(d, p, time.Now)
	}
	if err != nil {
		out.Error = err.Error()
	}
	return json.NewEncoder(stdout).Encode(out)
}
