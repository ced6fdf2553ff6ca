// Package migrations reads a store's embedded schema files. Each store keeps
// its own files (its own SQL dialect) and applies them its own way; the
// naming rule and the ordering are the same for both, and live here.
package migrations

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one schema file, dir/NNNN_description.sql.
type Migration struct {
	Version int
	// Name is the file's name, such as 0001_init.sql.
	Name string
	SQL  string
}

// Load returns the *.sql files of dir in fsys in version order. A file whose
// name does not start with a positive version and an underscore, or two
// files with one version, are errors.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	names, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return nil, fmt.Errorf("listing migrations: %w", err)
	}
	ms := make([]Migration, 0, len(names))
	seen := map[int]string{}
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and an underscore (0001_init.sql)", base)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", other, base, v)
		}
		seen[v] = base
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", base, err)
		}
		ms = append(ms, Migration{Version: v, Name: base, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// Latest is the version of the newest migration in dir (0 when there is
// none): the schema a store that embeds them migrates a database to.
func Latest(fsys fs.FS, dir string) (int, error) {
	ms, err := Load(fsys, dir)
	if err != nil || len(ms) == 0 {
		return 0, err
	}
	return ms[len(ms)-1].Version, nil
}
