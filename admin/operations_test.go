package admin_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestStuckListNextPageAfterARefund: the console's stuck list pages by
// the last row's own id. A page ending on a refund led, before, to the
// page after the refund's charge (created before the refund), which holds
// that same refund again: the list never moved on.
func TestStuckListNextPageAfterARefund(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	_, first := e.stuckRefund(t, "rf-page-1")
	_, second := e.stuckRefund(t, "rf-page-2")
	c := e.console(t)
	next := regexp.MustCompile(`<a href="(/admin/\?[^"]*after=[^"]+)">Next page</a>`)
	row := regexp.MustCompile(`<a href="/admin/charges/[^"#]+#(re_[0-9a-f]+)">`)
	path := "/admin/?limit=1"
	var seen []string
	for range 4 {
		page := c.get(t, path)
		for _, m := range row.FindAllStringSubmatch(page, -1) {
			seen = append(seen, m[1])
		}
		m := next.FindStringSubmatch(page)
		if m == nil {
			break
		}
		path = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	if want := []string{first, second}; !slices.Equal(seen, want) {
		t.Fatalf("pages of one stuck row showed %v, want %v", seen, want)
	}
}

var _ = fmt.Sprintf
var _ = json.Marshal
var _ = apitest.APIKey
var _ = chargeonce.KindCapture
