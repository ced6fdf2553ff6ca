package chargeonce_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/chargeonce/chargeonce/internal/apitest"
)

// readmeMaxLines keeps the README a page a newcomer reads in five minutes;
// the rest belongs in docs/.
const readmeMaxLines = 250

// The README's two commands: the service on the embedded SQLite default, and
// the tests, which CI runs exactly.
const (
	theRunCommand  = "go run ./cmd/chargeonce serve"
	theTestCommand = "./scripts/test.sh"
)

// docFiles are the Markdown files the docs tests read: the README, the
// changelog and everything in docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md", "CHANGELOG.md"}, files...)
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The README stays short, runs CI's test command, and speaks of the product
// as it is: no issue numbers, no test names (those are in docs/testing.md).
func TestReadme(t *testing.T) {
	t.Parallel()
	readme := readDoc(t, "README.md")
	if n := strings.Count(readme, "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines; keep it to %d and move the rest to docs/", n, readmeMaxLines)
	}
	for _, cmd := range []string{theRunCommand, theTestCommand} {
		if !hasLine(readme, cmd) {
			t.Errorf("README.md has no line %q", cmd)
		}
	}
	if ci := readDoc(t, ".ci/run"); !hasLine(ci, theTestCommand) {
		t.Errorf(".ci/run does not run the README's test command %q", theTestCommand)
	}
	if m := regexp.MustCompile(`\bTest[A-Z]\w*`).FindString(readme); m != "" {
		t.Errorf("README.md names the test %s; say what it proves in docs/testing.md", m)
	}
}

func hasLine(text, line string) bool {
	for l := range strings.Lines(text) {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// issueRef is how a page would cite the tracker ("issue 12", "issues 3 and
// 4"): history, which belongs in git and the changelog's words, not in docs.
var issueRef = regexp.MustCompile(`(?i)\bissues?\s+#?\d+`)

func TestDocsNameNoIssue(t *testing.T) {
	t.Parallel()
	for _, name := range docFiles(t) {
		for i, line := range strings.Split(readDoc(t, name), "\n") {
			if m := issueRef.FindString(line); m != "" {
				t.Errorf("%s:%d names %q: describe the product as it is", name, i+1, m)
			}
		}
	}
}

// Every relative link in the README, the changelog and docs/ points to a
// file or directory of the repository, and an #anchor to a heading of the
// page it names.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range docFiles(t) {
		for _, link := range links(readDoc(t, name)) {
			if err := checkLink(root, name, link); err != nil {
				t.Errorf("%s: link %s: %v", name, link, err)
			}
		}
	}
}

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	codeSpan   = regexp.MustCompile("`[^`\\n]*`")
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`(?m)^\s*\[[^\]]+\]:\s*(\S+)`)
)

// links returns the targets of a page's inline and reference links, outside
// code.
func links(md string) []string {
	md = fence.ReplaceAllString(md, "")
	md = codeSpan.ReplaceAllString(md, "")
	var out []string
	for _, m := range inlineLink.FindAllStringSubmatch(md, -1) {
		out = append(out, m[1])
	}
	for _, m := range refLink.FindAllStringSubmatch(md, -1) {
		out = append(out, m[1])
	}
	return out
}

func checkLink(root, from, link string) error {
	if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
		return nil
	}
	target, anchor, _ := strings.Cut(link, "#")
	path := from
	if target != "" {
		path = filepath.Join(filepath.Dir(from), filepath.FromSlash(target))
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("leaves the repository")
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("no such file: %s", path)
	}
	if anchor == "" || !strings.HasSuffix(path, ".md") {
		return nil
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		return err
	}
	if !headingAnchors(string(b))[anchor] {
		return fmt.Errorf("%s has no heading with anchor #%s", path, anchor)
	}
	return nil
}

// headingAnchors returns the anchors GitHub gives a page's headings:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered.
func headingAnchors(md string) map[string]bool {
	md = fence.ReplaceAllString(md, "")
	anchors := map[string]bool{}
	seen := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimRight(strings.TrimLeft(line, "#"), "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// # Docs are tests
//
// Every shell block (```sh, ```bash, ```shell) of the README and docs/ runs
// against a live server the test starts: the binary built from this tree,
// `serve` on SQLite in a temporary directory (its default ./chargeonce.db,
// the blocks' working directory too), on free loopback ports that replace
// the documented 127.0.0.1:8080 (the API), 127.0.0.1:8081 (the operators'
// API) and 127.0.0.1:9090 (the stand-alone acquirer). The blocks of one
// page run in order in one shell, as a person types them into one terminal:
// an id a later block needs is taken from an earlier answer by the page
// itself (CH=$(curl … | jq -r .id)). A block fails when its last command
// exits non-zero, or when the answer shown right after it (an ```http
// block: the status line, the headers shown and the JSON fields shown; or a
// ```json block: the JSON fields shown) differs from the one it got; ids
// and timestamps are compared by shape (ch_… stays ch_…, a time stays a
// time), a string with … by what it shows.
//
// A block that cannot run says why right above it, in a comment the test
// counts and prints:
//
//	<!-- doc-test: skip — needs a NATS JetStream server -->
//
// A block with no language whose first line is a command (chargeonce, go,
// curl, make, ./scripts) must say sh and run, or say why not.

// docSkip is the marker of a block that cannot run, with its reason.
var docSkip = regexp.MustCompile(`<!--\s*doc-test:\s*skip\s*[—–-]+\s*(.*?)\s*-->`)

// docCommand is how an untagged block's first line looks when it is a
// command someone would type.
var docCommand = regexp.MustCompile(`^\s*(\$ )?(chargeonce|go|curl|make|\./scripts/|git|jq)\b`)

type docBlock struct {
	file  string
	line  int    // the opening fence's line, 1-based
	lang  string // the fence's info string
	text  string
	skip  string // the skip marker's reason
	shown *docBlock
}

func (b *docBlock) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// docBlocks returns a page's fenced blocks; an ```http or ```json block that
// follows a shell block (blank lines between them at most) is its shown
// answer.
func docBlocks(file, md string) []*docBlock {
	lines := strings.Split(md, "\n")
	var out []*docBlock
	var prevEnd = -10
	var prev *docBlock
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "```") {
			continue
		}
		b := &docBlock{file: file, line: i + 1, lang: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
		for j := i - 1; j >= 0 && j >= i-3; j-- {
			if m := docSkip.FindStringSubmatch(lines[j]); m != nil {
				b.skip = m[1]
				break
			}
			if strings.TrimSpace(lines[j]) != "" && !strings.HasPrefix(strings.TrimSpace(lines[j]), "<!--") {
				break
			}
		}
		var body []string
		j := i + 1
		for ; j < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[j]), "```"); j++ {
			body = append(body, lines[j])
		}
		b.text = strings.Join(body, "\n") + "\n"
		adjacent := prev != nil && isShell(prev.lang) && strings.TrimSpace(strings.Join(lines[prevEnd+1:i], "")) == ""
		if (b.lang == "http" || b.lang == "json") && adjacent {
			prev.shown = b
		}
		out = append(out, b)
		prev, prevEnd, i = b, j, j
	}
	return out
}

func isShell(lang string) bool { return lang == "sh" || lang == "bash" || lang == "shell" }

// TestDocsShellBlocksAreMarked: a command shown without a language is a
// shell block that escaped the doc test.
func TestDocsShellBlocksAreMarked(t *testing.T) {
	t.Parallel()
	for _, name := range docFiles(t) {
		for _, b := range docBlocks(name, readDoc(t, name)) {
			first, _, _ := strings.Cut(strings.TrimLeft(b.text, "\n"), "\n")
			if b.lang == "" && docCommand.MatchString(first) {
				t.Errorf("%s: a block of commands (%q) with no language: mark it ```sh (the doc test runs it) and, if it cannot run, say why (<!-- doc-test: skip — why -->)", b, first)
			}
		}
	}
}

// TestDocsRunAsWritten runs every shell block of the README and docs/
// against a live server.
func TestDocsRunAsWritten(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("the doc test runs the blocks in bash:", err)
	}
	for _, tool := range []string{"curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the docs' blocks use %s: install it (apt-get install %s): %v", tool, tool, err)
		}
	}
	var pages [][]*docBlock
	var skipped []string
	runnable := 0
	for _, name := range docFiles(t) {
		if name == "CHANGELOG.md" {
			continue
		}
		var run []*docBlock
		for _, b := range docBlocks(name, readDoc(t, name)) {
			switch {
			case !isShell(b.lang):
			case b.skip != "":
				skipped = append(skipped, fmt.Sprintf("%s: %s", b, b.skip))
			default:
				run = append(run, b)
			}
		}
		runnable += len(run)
		if len(run) > 0 {
			pages = append(pages, run)
		}
	}
	t.Logf("doc blocks: %d run, %d not runnable:\n  %s", runnable, len(skipped), strings.Join(skipped, "\n  "))

	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", filepath.Join(bin, "chargeonce"), "./cmd/chargeonce")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/chargeonce: %v\n%s", err, out)
	}
	home := filepath.Join(work, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	api, adminAddr, acq := docFreeAddr(t), docFreeAddr(t), docFreeAddr(t)
	serve := exec.CommandContext(t.Context(), filepath.Join(bin, "chargeonce"), "serve", "--addr", api, "--admin-addr", adminAddr)
	serve.Dir = home
	serveLog := &apitest.Buffer{} // serve's log: written by exec's copying goroutine, read on a failure
	serve.Stdout, serve.Stderr = serveLog, serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = serve.Process.Signal(os.Interrupt); _ = serve.Wait() })
	if err := docWaitHealthy("http://" + api + "/healthz"); err != nil {
		t.Fatalf("serve did not answer /healthz: %v\n%s", err, serveLog.String())
	}
	rewrite := strings.NewReplacer("127.0.0.1:8080", api, "127.0.0.1:8081", adminAddr, "127.0.0.1:9090", acq)
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+home,
		"CHARGEONCE_URL=http://"+api, "CHARGEONCE_ADMIN_URL=http://"+adminAddr)

	failed := 0
	for _, page := range pages {
		for _, r := range runPage(t, home, env, rewrite, page) {
			if r.err != nil {
				failed++
				t.Errorf("%s: %v\n--- the block:\n%s--- its output:\n%s", r.block, r.err, r.block.text, r.out)
			}
		}
	}
	if failed > 0 {
		t.Logf("%d of %d doc blocks failed; serve's log:\n%s", failed, runnable, tailOf(serveLog.String(), 40))
	}
}

type docResult struct {
	block *docBlock
	out   string
	err   error
}

// runPage runs a page's blocks in order in one bash, each block's output
// to a file of its own, and judges each.
func runPage(t *testing.T, dir string, env []string, rewrite *strings.Replacer, page []*docBlock) []docResult {
	t.Helper()
	outDir := t.TempDir()
	var script strings.Builder
	for i, b := range page {
		// stdout and stderr apart, as a terminal shows them: curl prints
		// no progress meter on one.
		fmt.Fprintf(&script, "{\n%s\n} >%s 2>%s </dev/null\necho $? >%s\n", rewrite.Replace(b.text),
			filepath.Join(outDir, fmt.Sprintf("%d.out", i)), filepath.Join(outDir, fmt.Sprintf("%d.err", i)),
			filepath.Join(outDir, fmt.Sprintf("%d.rc", i)))
	}
	// Whatever a page left running in the background (an acquirer) ends
	// with its shell.
	script.WriteString("sleep 0.5\nkill $(jobs -p) 2>/dev/null\nwait\n")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "--noprofile", "--norc")
	sh.Dir, sh.Env, sh.Stdin = dir, env, strings.NewReader(script.String())
	var shOut bytes.Buffer
	sh.Stdout, sh.Stderr = &shOut, &shOut
	if err := sh.Run(); err != nil {
		t.Logf("%s's shell: %v\n%s", page[0].file, err, shOut.String())
	}
	var res []docResult
	for i, b := range page {
		out, _ := os.ReadFile(filepath.Join(outDir, fmt.Sprintf("%d.out", i)))
		errOut, _ := os.ReadFile(filepath.Join(outDir, fmt.Sprintf("%d.err", i)))
		rc, err := os.ReadFile(filepath.Join(outDir, fmt.Sprintf("%d.rc", i)))
		r := docResult{block: b, out: string(out) + string(errOut)}
		switch {
		case err != nil:
			r.err = fmt.Errorf("did not finish")
		case strings.TrimSpace(string(rc)) != "0":
			r.err = fmt.Errorf("exit status %s", strings.TrimSpace(string(rc)))
		case b.shown != nil:
			r.err = compareShown(b.shown, string(out))
		default:
			r.err = refused(string(out))
		}
		res = append(res, r)
	}
	return res
}

// compareShown compares what a block printed with the answer the page
// shows after it.
func compareShown(shown *docBlock, got string) error {
	wantHead, wantBody := splitHTTP(shown.text)
	if shown.lang == "json" {
		wantHead, wantBody = "", strings.TrimSpace(shown.text)
	}
	gotHead, gotBody := splitHTTP(got)
	if !strings.HasPrefix(got, "HTTP/") {
		gotHead, gotBody = "", got
	}
	if wantHead != "" {
		wl := strings.Split(wantHead, "\n")
		gl := strings.Split(gotHead, "\n")
		if strings.TrimSpace(wl[0]) != strings.TrimSpace(gl[0]) {
			return fmt.Errorf("%s shows %q, the answer was %q", shown, strings.TrimSpace(wl[0]), strings.TrimSpace(gl[0]))
		}
		for _, h := range wl[1:] {
			name, want, ok := strings.Cut(h, ":")
			if !ok {
				continue
			}
			found := false
			for _, g := range gl[1:] {
				gn, gv, _ := strings.Cut(g, ":")
				if strings.EqualFold(strings.TrimSpace(gn), strings.TrimSpace(name)) {
					found = true
					if strings.TrimSpace(gv) != strings.TrimSpace(want) {
						return fmt.Errorf("%s shows %s: %s, the answer had %s", shown, name, strings.TrimSpace(want), strings.TrimSpace(gv))
					}
				}
			}
			if !found {
				return fmt.Errorf("%s shows the header %s, the answer has none", shown, name)
			}
		}
	}
	if strings.TrimSpace(wantBody) == "" {
		return nil
	}
	var want any
	if err := json.Unmarshal([]byte(wantBody), &want); err != nil {
		return fmt.Errorf("%s: the body shown is not JSON: %w", shown, err)
	}
	var g any
	if err := json.NewDecoder(strings.NewReader(strings.TrimSpace(gotBody))).Decode(&g); err != nil {
		return fmt.Errorf("%s shows a JSON body; the answer's is not JSON (%w)", shown, err)
	}
	return compareJSON(shown.String(), "", want, g)
}

// refused says what went wrong when a block's answers (curl -i) include a
// 4xx or 5xx the page does not show: a person reading it would take it
// for the page's mistake (an id that is not there).
func refused(out string) error {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") && len(f[1]) == 3 && f[1] >= "400" {
			return fmt.Errorf("answered %q, and the page shows no such answer", strings.TrimSpace(l))
		}
	}
	return nil
}

// splitHTTP splits curl -i's output (or a shown answer) into its head and
// its body.
func splitHTTP(s string) (head, body string) {
	s = strings.ReplaceAll(strings.TrimLeft(s, "\n"), "\r\n", "\n")
	head, body, _ = strings.Cut(s, "\n\n")
	return head, body
}

// compareJSON compares the fields the page shows with the answer's.
func compareJSON(where, path string, want, got any) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s shows an object at %q, the answer has %v", where, path, got)
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s shows the field %s%s, the answer has none", where, path, k)
			}
			if err := compareJSON(where, path+k+".", wv, gv); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) < len(w) {
			return fmt.Errorf("%s shows %d items at %q, the answer has %v", where, len(w), path, got)
		}
		for i := range w {
			if err := compareJSON(where, fmt.Sprintf("%s%d.", path, i), w[i], g[i]); err != nil {
				return err
			}
		}
		return nil
	case string:
		g, ok := got.(string)
		field := strings.TrimSuffix(path, ".")
		if i := strings.LastIndex(field, "."); i >= 0 {
			field = field[i+1:]
		}
		switch {
		case !ok:
			return fmt.Errorf("%s shows %s = %q, the answer has %v", where, field, w, got)
		case volatileField(field):
			if !sameShape(w, g) {
				return fmt.Errorf("%s shows %s = %q, the answer's %q is not of that shape", where, field, w, g)
			}
		case strings.Contains(w, "…"):
			before, after, _ := strings.Cut(w, "…")
			if !strings.HasPrefix(g, before) || !strings.HasSuffix(g, after) {
				return fmt.Errorf("%s shows %s = %q, the answer has %q", where, field, w, g)
			}
		case w != g:
			return fmt.Errorf("%s shows %s = %q, the answer has %q", where, field, w, g)
		}
		return nil
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Errorf("%s shows %s = %v, the answer has %v", where, strings.TrimSuffix(path, "."), want, got)
		}
		return nil
	}
}

// volatileField is a field whose value differs every run: ids and times.
func volatileField(name string) bool {
	return name == "id" || strings.HasSuffix(name, "_id") || strings.HasSuffix(name, "_at") || name == "time" || name == "timestamp"
}

// sameShape: an id keeps its prefix (ch_, re_, …), a time parses as one.
func sameShape(want, got string) bool {
	if _, err := time.Parse(time.RFC3339, want); err == nil {
		_, err := time.Parse(time.RFC3339, got)
		return err == nil
	}
	if p, _, ok := strings.Cut(want, "_"); ok {
		return strings.HasPrefix(got, p+"_") && len(got) > len(p)+1
	}
	return got != ""
}

func docFreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func docWaitHealthy(url string) error {
	var last error
	for range 300 {
		resp, err := http.Get(url) //nolint:noctx,gosec // a local probe, bounded by the loop
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

func tailOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// The Go receiver in docs/webhooks.md fulfils orders from charge events
// only: a delivery's type says what it is (webhook.test, refund.created,
// charge.declined …), and the example passed every one, the endpoint's test
// ping too, to the fulfilment code.
func TestDocsWebhookReceiverChecksTheEventType(t *testing.T) {
	t.Parallel()
	found := false
	for _, b := range docBlocks("docs/webhooks.md", readDoc(t, "docs/webhooks.md")) {
		if b.lang != "go" || !strings.Contains(b.text, "webhook.Handler{") {
			continue
		}
		found = true
		if !strings.Contains(b.text, "ev.Type") {
			t.Errorf("%s: the receiver passes every event to fulfilment, webhook.test too: look at ev.Type first", b)
		}
	}
	if !found {
		t.Error("docs/webhooks.md has no Go receiver (webhook.Handler) any more: update this test")
	}
}

// The test tiers: the README's command runs every test but the full
// tier's (FULL_TIER in scripts/test.sh, by -skip), --full runs those (by
// -run), and CI runs both, so a test in the full tier neither skips nor
// goes unrun. Each test FULL_TIER names exists.
func TestTestTiers(t *testing.T) {
	t.Parallel()
	script := readDoc(t, "scripts/test.sh")
	m := regexp.MustCompile(`(?m)^FULL_TIER='([^']+)'$`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("scripts/test.sh names no FULL_TIER='…' pattern")
	}
	for _, want := range []string{`-skip "$FULL_TIER"`, `-run "$FULL_TIER"`} {
		if !strings.Contains(script, want) {
			t.Errorf("scripts/test.sh does not run go test %s", want)
		}
	}
	if ci := readDoc(t, ".ci/run"); !hasLine(ci, theTestCommand+" --full") {
		t.Errorf(".ci/run does not run the full tier (%s --full)", theTestCommand)
	}
	if mk := readDoc(t, "Makefile"); !strings.Contains(mk, "test-full:") || !strings.Contains(mk, theTestCommand+" --full") {
		t.Errorf("the Makefile has no test-full target running %s --full", theTestCommand)
	}
	// The quick tier (make test) is a selection too: packages, and tests
	// of them left to the suite.
	quick := readDoc(t, "scripts/test-quick.sh")
	if mk := readDoc(t, "Makefile"); !strings.Contains(mk, "\ntest: ") || !strings.Contains(mk, "\t./scripts/test-quick.sh\n") {
		t.Errorf("the Makefile's test target does not run ./scripts/test-quick.sh")
	}
	q := regexp.MustCompile(`(?m)^QUICK_SKIP='([^']+)'$`).FindStringSubmatch(quick)
	if q == nil || !strings.Contains(quick, `-skip "$QUICK_SKIP"`) {
		t.Fatal(`scripts/test-quick.sh names no QUICK_SKIP='…' pattern it runs go test -skip with`)
	}
	for _, name := range regexp.MustCompile(`\^?(Test\w+)\$?`).FindAllStringSubmatch(m[1]+"|"+q[1], -1) {
		out, err := exec.CommandContext(t.Context(), "grep", "-rlE", "--include=*_test.go", `^func `+name[1]+`\(`, ".").Output()
		if err != nil || len(bytes.TrimSpace(out)) == 0 {
			t.Errorf("FULL_TIER or QUICK_SKIP names %s, which no _test.go file declares", name[1])
		}
	}
}
