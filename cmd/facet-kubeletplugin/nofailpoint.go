//go:build !facet_failpoints

package main

import "context"

const failpointsCompiled = false

// failpoint is nil in the shipped binary: no environment variable can make
// it stop mid-prepare.
func failpoint(context.Context) func(string) { return nil }
