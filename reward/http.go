package reward

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
)

// maxAnswer bounds an answer's size (64 MiB).
const maxAnswer = 64 << 20

// httpTransport POSTs requests to a grader's URL.
type httpTransport struct {
	url, key string
	client   *http.Client
}

func newHTTP(opt Options) *httpTransport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = opt.Concurrency
	return &httpTransport{url: opt.URL, key: opt.APIKey, client: &http.Client{Transport: tr}}
}

func (h *httpTransport) do(ctx context.Context, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if h.key != "" {
		req.Header.Set("Authorization", "Bearer "+h.key)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s: %q", resp.Status, head(b))
	}
	if len(b) > maxAnswer {
		return nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	return b, nil
}

func (h *httpTransport) close() error {
	h.client.CloseIdleConnections()
	return nil
}
