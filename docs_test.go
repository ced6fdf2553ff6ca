package chargeonce_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
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
