// Package imex is facet-imex: the IMEX daemon of one ComputeDomain on one
// node (docs/design/compute-domains.md). It watches its domain, writes
// nvidia-imex's configuration and peer list (the domain's status.nodes,
// one address a line, by index) into its state directory, runs nvidia-imex
// in the foreground chrooted into the driver's root, sends it SIGUSR1 when
// the peer list changes, and records its state in a file that `facet-imex
// probe`, the pod's readiness probe, reads. With --simulate there is no
// nvidia-imex: the stand-in is ready when the peer list is complete.
package imex

import (
	"bytes"
	_ "embed"
	"fmt"
	"text/template"
)

// File names in the state directory.
const (
	// ConfigName is nvidia-imex's configuration (its -c).
	ConfigName = "imexd.cfg"
	// NodesName is the peer list, IMEX_NODE_CONFIG_FILE.
	NodesName = "nodes.cfg"
	// StateName is facet-imex's state, which the probe reads.
	StateName = "state.json"
	// tempPrefix starts the temporary files of atomic writes.
	tempPrefix = ".facet-imex-"
)

// Ports of NVIDIA's configuration template
// (templates/compute-domain-daemon-config.tmpl.cfg in
// NVIDIA/k8s-dra-driver-gpu), nvidia-imex's defaults too.
const (
	// ServerPort is IMEX's first TCP port for peer connections.
	ServerPort = 50000
	// CmdPort is IMEX's command service, which nvidia-imex-ctl queries.
	CmdPort = 50005
)

// ConfigData is what the configuration says that varies.
type ConfigData struct {
	// Domain is the ComputeDomain, "<namespace>/<name> (<uid>)", for the
	// file's header.
	Domain string
	// StateDir is the state directory as nvidia-imex sees it: its
	// IMEX_NODE_CONFIG_FILE and stats file are in it.
	StateDir string
	// CmdBindIP is the address the command service binds, the node's own
	// peer address (NVIDIA's template binds the daemon pod's IP; Facet's
	// daemons run in the node's network and peer on node addresses).
	CmdBindIP string
}

//go:embed imexd.cfg.tmpl
var configTemplateText string

var configTemplate = template.Must(template.New(ConfigName).Option("missingkey=error").Parse(configTemplateText))

// RenderConfig is nvidia-imex's configuration file for d: NVIDIA's
// template's settings (DAEMONIZE=0, SERVER_PORT=50000, IMEX_CMD_PORT=50005,
// IMEX_WAIT_FOR_QUORUM=RECOVERY, logs to standard error), with the peer
// list and the stats file in d.StateDir. The error names an empty field.
func RenderConfig(d ConfigData) ([]byte, error) {
	if d.StateDir == "" || d.CmdBindIP == "" || d.Domain == "" {
		return nil, fmt.Errorf("IMEX configuration: state directory %q, command bind address %q and domain %q are all required", d.StateDir, d.CmdBindIP, d.Domain)
	}
	var b bytes.Buffer
	if err := configTemplate.Execute(&b, struct {
		ConfigData
		ServerPort, CmdPort int
		NodesName           string
	}{d, ServerPort, CmdPort, NodesName}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
