package chargeonce_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The adapters (the HTTP API and the queue worker) share the engine, the
// stores and the wire format below them; neither imports the other.
func TestAdaptersDoNotImportEachOther(t *testing.T) {
	t.Parallel()
	const module = "github.com/chargeonce/chargeonce/"
	for dir, forbidden := range map[string]string{"queue": "httpapi", "httpapi": "queue"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == module+forbidden {
					t.Errorf("%s imports %s: what both adapters need belongs below them (wire/, the root package)", f, p)
				}
			}
		}
	}
}
