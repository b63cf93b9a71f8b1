// Package daemon is a small client of zygoted's REST API (the parts the node agent,
// the tests and the bench use). The API itself is documented at GET /v1/openapi.json.
package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Client talks to one zygoted.
type Client struct {
	// URL: base URL, e.g. http://127.0.0.1:7420.
	URL   string
	Token string
	HTTP  *http.Client
}

// New makes a client; the token is read from tokenFile (the daemon's `<state>/token`)
// on every request when token is empty, so a daemon that created its token after the
// agent started is still reached.
func New(baseURL, token string) *Client {
	return &Client{URL: strings.TrimRight(baseURL, "/"), Token: token,
		HTTP: &http.Client{Timeout: 120 * time.Second}}
}

// TokenFromStateDir reads `<dir>/token`.
func TokenFromStateDir(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// APIError is a non-2xx answer: the daemon's error body.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("zygoted: %d %s: %s", e.Status, e.Code, e.Message)
}

// IsNotFound says whether err is a 404 from the daemon.
func IsNotFound(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// IsClientError says whether the daemon refused the request as invalid (4xx): retrying
// the same request will not help.
func IsClientError(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status >= 400 && e.Status < 500
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var body struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		e := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(data, &body) == nil && body.Error.Message != "" {
			e.Code, e.Message = body.Error.Code, body.Error.Message
		} else {
			e.Message = strings.TrimSpace(string(data))
		}
		return e
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

// Sandbox is the daemon's view of one VM (the fields used here).
type Sandbox struct {
	ID         string            `json:"id"`
	Name       *string           `json:"name"`
	State      string            `json:"state"`
	Runtime    string            `json:"runtime"`
	Metadata   map[string]string `json:"metadata"`
	MemMiB     int32             `json:"mem_mib"`
	VCPUs      int32             `json:"vcpus"`
	CreatedAt  int64             `json:"created_at"`
	Pid        *int              `json:"pid"`
	ExitReason *string           `json:"exit_reason"`
	TTLSecs    *int64            `json:"ttl_secs"`
	ExpiresAt  *int64            `json:"expires_at"`
}

// CreateRequest is POST /v1/sandboxes.
type CreateRequest struct {
	// N: how many sandboxes (fan-out); 0 means 1.
	N        int32             `json:"n,omitempty"`
	Image    string            `json:"image,omitempty"`
	Snapshot string            `json:"snapshot,omitempty"`
	MemMiB   int32             `json:"mem_mib,omitempty"`
	VCPUs    int32             `json:"vcpus,omitempty"`
	TTLSecs  *int64            `json:"ttl_secs,omitempty"`
	Network  string            `json:"network,omitempty"`
	AllowOut []string          `json:"allow_out,omitempty"`
	DenyOut  []string          `json:"deny_out,omitempty"`
	Envs     map[string]string `json:"envs,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// BranchRequest is POST /v1/sandboxes/{id}/branch.
type BranchRequest struct {
	Count    int32             `json:"count,omitempty"`
	TTLSecs  *int64            `json:"ttl_secs,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// BranchResponse lists the children.
type BranchResponse struct {
	Parent      string   `json:"parent"`
	BranchPoint string   `json:"branch_point"`
	Children    []string `json:"children"`
	Failed      []struct {
		Index int    `json:"index"`
		Error string `json:"error"`
	} `json:"failed"`
}

// ExecResult is POST /v1/sandboxes/{id}/exec's answer.
type ExecResult struct {
	ExitCode *int   `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// Info is the part of GET /v1/info used here.
type Info struct {
	Version string `json:"version"`
	Runtime struct {
		Name        string            `json:"name"`
		Unavailable map[string]string `json:"unavailable"`
	} `json:"runtime"`
}

// Healthz checks GET /healthz.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil)
}

// Info is GET /v1/info.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var i Info
	return &i, c.do(ctx, http.MethodGet, "/v1/info", nil, &i)
}

// List is GET /v1/sandboxes, filtered by metadata pairs (ANDed).
func (c *Client) List(ctx context.Context, metadata map[string]string) ([]Sandbox, error) {
	q := url.Values{}
	for k, v := range metadata {
		q.Add("metadata", k+"="+v)
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	return out.Sandboxes, c.do(ctx, http.MethodGet, path, nil, &out)
}

// Get is GET /v1/sandboxes/{id}.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var s Sandbox
	return &s, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, &s)
}

// Create is POST /v1/sandboxes (it answers once the VM runs).
func (c *Client) Create(ctx context.Context, r CreateRequest) ([]Sandbox, error) {
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	return out.Sandboxes, c.do(ctx, http.MethodPost, "/v1/sandboxes", r, &out)
}

// Branch is POST /v1/sandboxes/{id}/branch.
func (c *Client) Branch(ctx context.Context, id string, r BranchRequest) (*BranchResponse, error) {
	var out BranchResponse
	return &out, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/branch", r, &out)
}

// Delete is DELETE /v1/sandboxes/{id}; a sandbox already gone is not an error.
func (c *Client) Delete(ctx context.Context, id string) error {
	err := c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, nil)
	if IsNotFound(err) {
		return nil
	}
	return err
}

// Exec runs argv in the sandbox and waits for it.
func (c *Client) Exec(ctx context.Context, id string, argv []string) (*ExecResult, error) {
	var out ExecResult
	body := map[string]any{"argv": argv}
	return &out, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", body, &out)
}

// Images lists the names of the images the daemon has (name and name-sha256 forms).
func (c *Client) Images(ctx context.Context) ([]string, error) {
	var out struct {
		Images []struct {
			Name   string `json:"name"`
			SHA256 string `json:"sha256"`
		} `json:"images"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/images", nil, &out); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var names []string
	for _, i := range out.Images {
		for _, n := range []string{i.Name, i.Name + "-" + i.SHA256} {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	return names, nil
}

// Snapshots lists the ids and names of the daemon's snapshots (not implicit ones).
func (c *Client) Snapshots(ctx context.Context) ([]string, error) {
	var out struct {
		Snapshots []struct {
			ID       string  `json:"id"`
			Name     *string `json:"name"`
			Implicit bool    `json:"implicit"`
		} `json:"snapshots"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/snapshots", nil, &out); err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range out.Snapshots {
		if s.Implicit {
			continue
		}
		ids = append(ids, s.ID)
		if s.Name != nil && *s.Name != "" {
			ids = append(ids, *s.Name)
		}
	}
	return ids, nil
}

// SnapshotFull takes a full snapshot of a running sandbox and returns its id.
func (c *Client) SnapshotFull(ctx context.Context, sandbox string) (string, error) {
	var out struct {
		ID string `json:"id"`
	}
	err := c.do(ctx, http.MethodPost, "/v1/snapshots", map[string]string{"sandbox": sandbox, "kind": "full"}, &out)
	return out.ID, err
}

// DeleteSnapshot is DELETE /v1/snapshots/{id}.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil)
}

// PushSnapshot pushes a snapshot as a pack to reference (the daemon's NDJSON stream
// read to its end) and returns the manifest digest.
func (c *Client) PushSnapshot(ctx context.Context, id, reference string) (string, error) {
	b, _ := json.Marshal(map[string]string{"reference": reference})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/v1/snapshots/"+url.PathEscape(id)+"/push", bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := *c.HTTP
	hc.Timeout = 30 * time.Minute
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return "", &APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(data))}
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type    string `json:"type"`
			Digest  string `json:"digest"`
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if err := dec.Decode(&ev); err != nil {
			return "", fmt.Errorf("push stream ended without a result: %w", err)
		}
		switch ev.Type {
		case "pushed":
			return ev.Digest, nil
		case "error":
			return "", &APIError{Status: 502, Code: ev.Code, Message: ev.Message}
		}
	}
}
