package httpapi

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the OpenAPI 3.1 document of the HTTP API, written by hand from
// SPEC "HTTP API (v1)" and served at GET /openapi.yaml. The conformance test
// (openapi_test.go) validates real answers of a running server against it on
// both stores, so a change to the API that is not made here too fails CI.
//
//go:embed openapi.yaml
var OpenAPI []byte

// handleOpenAPI serves the embedded document. It needs no authentication:
// it describes the API, it holds no data.
func handleOpenAPI(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/yaml")
	h.Set("Cache-Control", "public, max-age=300")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(OpenAPI)
}
