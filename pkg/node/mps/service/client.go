package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/node/mps"
)

// Client is the kubelet plugin's side: the driver's Partitioner over
// facet-mps's socket. Every error names the socket, so that a prepare that
// fails for want of facet-mps says so.
type Client struct {
	dir, sock string
	hc        *http.Client

	mu       sync.Mutex
	instance string
	// restarted: an answer came from another instance than the one
	// before, not yet reported by Check.
	restarted string
}

// Dial waits up to wait for facet-mps to answer on dir/SocketName with a
// control program (it has none while a simulated driver root is not laid
// out yet), and returns a client; or an error saying what was last seen.
// dir is the MPS directory, the same path on the host (the CDI specs' mounts).
func Dial(ctx context.Context, dir string, waitFor time.Duration) (*Client, error) {
	c := NewClient(dir)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, waitFor, true, func(ctx context.Context) (bool, error) {
		info, err := c.Info(ctx)
		switch {
		case err != nil && ctx.Err() != nil && last != nil:
			// The wait ran out during this call: the answer before
			// it says more than the deadline does.
		case err != nil:
			last = err
		case info.Control == "":
			last = fmt.Errorf("facet-mps at %s has no MPS control program: %s", c.sock, info.ControlError)
		default:
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no facet-mps ready within %s: %w", waitFor, last)
	}
	return c, nil
}

// NewClient is a client of the facet-mps serving dir, which it does not
// reach yet.
func NewClient(dir string) *Client {
	sock := filepath.Join(dir, SocketName)
	return &Client{dir: dir, sock: sock, hc: &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
		// A daemon's start or stop is bounded by facet-mps's StopTimeout
		// (10 s), twice over for a stop that kills.
		Timeout: time.Minute,
	}}
}

// Info asks facet-mps what it serves.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var info Info
	if err := c.call(ctx, http.MethodGet, "/v1/info", nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Acquire: mps.Manager.Acquire in facet-mps. A refusal for another UID is
// an *mps.UserConflictError, as in process.
func (c *Client) Acquire(ctx context.Context, gpuUUID string, claim types.UID, user int64) error {
	return c.call(ctx, http.MethodPost, "/v1/acquire", acquireRequest{GPU: gpuUUID, Claim: claim, User: user}, nil)
}

// Release: mps.Manager.Release in facet-mps.
func (c *Client) Release(ctx context.Context, claim types.UID) error {
	return c.call(ctx, http.MethodPost, "/v1/release", releaseRequest{Claim: claim}, nil)
}

// Edits are mps.EditsFor the client's MPS directory: no call.
func (c *Client) Edits(gpuUUID string, cores int64) *cdispec.ContainerEdits {
	return mps.EditsFor(c.dir, gpuUUID, cores)
}

// Daemon is the GPU's live daemon; nil if none, or if facet-mps cannot
// be reached.
func (c *Client) Daemon(gpuUUID string) *mps.Record {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp daemonResponse
	if err := c.call(ctx, http.MethodGet, "/v1/daemon?gpu="+url.QueryEscape(gpuUUID), nil, &resp); err != nil {
		return nil
	}
	return resp.Daemon
}

// Restore: mps.Manager.Restore in facet-mps. It hands over every holder,
// so a restart seen before it needs no reporting.
func (c *Client) Restore(ctx context.Context, holders map[string]map[types.UID]int64) ([]string, error) {
	var resp restartedResponse[[]string]
	if err := c.call(ctx, http.MethodPost, "/v1/restore", restoreRequest{Holders: holders}, &resp); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.restarted = ""
	c.mu.Unlock()
	return resp.result()
}

// Check: mps.Manager.Check in facet-mps; mps.ErrHoldersLost (wrapped) when
// facet-mps is not the process of the last call.
func (c *Client) Check(ctx context.Context) (map[string][]types.UID, error) {
	var resp restartedResponse[map[string][]types.UID]
	if err := c.call(ctx, http.MethodPost, "/v1/check", nil, &resp); err != nil {
		return nil, err
	}
	c.mu.Lock()
	was := c.restarted
	c.restarted = ""
	c.mu.Unlock()
	if was != "" {
		return nil, fmt.Errorf("%w (%s)", mps.ErrHoldersLost, was)
	}
	return resp.result()
}

// call makes one request; a non-2xx answer is its errorResponse's error.
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://facet-mps"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("facet-mps unreachable at %s (is the chart's MPS pod running on this node?): %w", c.sock, err)
	}
	defer resp.Body.Close()
	if id := resp.Header.Get(instanceHeader); id != "" && path != "/v1/info" {
		c.mu.Lock()
		if c.instance != "" && c.instance != id {
			c.restarted = "instance " + id + ", was " + c.instance
		}
		c.instance = id
		c.mu.Unlock()
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("facet-mps at %s: %w", c.sock, err)
	}
	if resp.StatusCode/100 != 2 {
		var e errorResponse
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			return fmt.Errorf("facet-mps at %s: %s: %s", c.sock, resp.Status, bytes.TrimSpace(data))
		}
		if e.Conflict != nil {
			return e.Conflict
		}
		return errors.New(e.Error)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("facet-mps at %s: answer: %w", c.sock, err)
	}
	return nil
}
