package reward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// maxAnswer bounds an answer's size (64 MiB), over HTTP and as a
// command's line.
const maxAnswer = 64 << 20

// errRedirect refuses redirects: following one would turn the POST into
// a GET (301, 302) and could carry the API key elsewhere.
var errRedirect = errors.New("redirects are not followed (set reward.url to the final URL)")

// httpTransport POSTs requests to a grader's URL.
type httpTransport struct {
	url, key string
	client   *http.Client
}

func newHTTP(opt Options) *httpTransport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = opt.Concurrency
	return &httpTransport{url: opt.URL, key: opt.APIKey, client: &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect },
	}}
}

// retryable reports whether an HTTP status is worth a retry: 408, 429
// and 5xx.
func retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500
}

func (h *httpTransport) do(ctx context.Context, body []byte, _ string) ([]byte, error) {
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
		if errors.Is(err, errRedirect) {
			loc := ""
			if resp != nil {
				loc = resp.Header.Get("Location")
				resp.Body.Close()
			}
			return nil, permanentError{fmt.Errorf("HTTP redirect to %q: %w", loc, errRedirect)}
		}
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("HTTP %s: %q", resp.Status, head(b))
		if !retryable(resp.StatusCode) {
			return nil, permanentError{err}
		}
		return nil, err
	}
	if len(b) > maxAnswer {
		return nil, permanentError{fmt.Errorf("answer larger than %d bytes", maxAnswer)}
	}
	return b, nil
}

func (h *httpTransport) close() error {
	h.client.CloseIdleConnections()
	return nil
}
