package admin

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/recon"
)

// The console's reconciliation page (SPEC "Reconciliation (v4)"): the
// latest runs, and the exceptions of one, each linked to its charge and
// acknowledgeable with a note; the acknowledgement is the audit entry (who,
// when, why), append-only.

// reconRoutes mounts the page; consoleRoutes calls it.
func (s *Server) reconRoutes(m *http.ServeMux) {
	m.HandleFunc("GET /admin/recon", s.page(s.reconPage))
	m.HandleFunc("POST /admin/recon/ack", s.page(s.reconAck))
}

// reconShown bounds the exceptions one page shows; the report (JSON, CSV)
// has them all.
const reconShown = 500

type reconException struct {
	recon.Mismatch
	Ack *chargeonce.ReconAck
}

type reconView struct {
	Runs       []chargeonce.ReconRun
	Run        *chargeonce.ReconRun
	Report     *recon.Report
	Exceptions []reconException
	More       int
	Types      []recon.Type
}

func (s *Server) reconStores() (chargeonce.ReconStore, chargeonce.ReconOps, error) {
	rs, ok1 := s.store.(chargeonce.ReconStore)
	ops, ok2 := s.store.(chargeonce.ReconOps)
	if !ok1 || !ok2 {
		return nil, nil, chargeonce.Errorf(chargeonce.EUNAVAILABLE, "this store keeps no reconciliation runs")
	}
	return rs, ops, nil
}

func (s *Server) reconPage(w http.ResponseWriter, r *http.Request, ss *session) error {
	rs, ops, err := s.reconStores()
	if err != nil {
		return err
	}
	runs, err := ops.ReconRunsList(r.Context(), 30)
	if err != nil {
		return err
	}
	v := reconView{Runs: runs, Types: recon.Types}
	acq, period := r.URL.Query().Get("acquirer"), r.URL.Query().Get("period")
	if acq == "" && period == "" && len(runs) > 0 {
		acq, period = runs[0].Acquirer, runs[0].Period
	}
	if acq != "" || period != "" {
		run, err := rs.ReconRunGet(r.Context(), acq, period)
		if err != nil {
			return err
		}
		var rep recon.Report
		if err := json.Unmarshal(run.Report, &rep); err != nil {
			return chargeonce.Errorf(chargeonce.EINTERNAL, "the stored report of %s %s does not decode: %v", acq, period, err)
		}
		acks, err := ops.ReconAcksList(r.Context(), acq, period)
		if err != nil {
			return err
		}
		byKey := map[string]*chargeonce.ReconAck{}
		for i := range acks {
			a := &acks[i]
			byKey[ackKey(a.Type, a.Reference, a.ObjectReference)] = a
		}
		for i, m := range rep.Mismatches {
			if i == reconShown {
				v.More = len(rep.Mismatches) - reconShown
				break
			}
			v.Exceptions = append(v.Exceptions, reconException{Mismatch: m, Ack: byKey[ackKey(string(m.Type), m.Reference, m.ObjectReference)]})
		}
		v.Run, v.Report = &run, &rep
	}
	s.render(w, r, http.StatusOK, "recon", view{Title: "Reconciliation", Admin: ss.admin, CSRF: ss.csrf, Data: v})
	return nil
}

func ackKey(typ, ref, obj string) string { return typ + "\x00" + ref + "\x00" + obj }

// reconAck acknowledges one exception of a stored run, then shows the run
// again (post/redirect/get).
func (s *Server) reconAck(w http.ResponseWriter, r *http.Request, ss *session) error {
	rs, ops, err := s.reconStores()
	if err != nil {
		return err
	}
	a := chargeonce.ReconAck{
		Acquirer: r.PostFormValue("acquirer"), Period: r.PostFormValue("period"), Type: r.PostFormValue("type"),
		Reference: r.PostFormValue("reference"), ObjectReference: r.PostFormValue("object_reference"),
		Actor: ss.admin, Note: strings.TrimSpace(r.PostFormValue("note")),
	}
	switch n := utf8.RuneCountInString(a.Note); {
	case n == 0:
		return chargeonce.FieldError("note", "say what you found: an acknowledgement needs a note")
	case n > chargeonce.MaxReconAckNote:
		return chargeonce.FieldError("note", "a note is at most %d characters; got %d", chargeonce.MaxReconAckNote, n)
	}
	run, err := rs.ReconRunGet(r.Context(), a.Acquirer, a.Period)
	if err != nil {
		return err
	}
	var rep recon.Report
	if err := json.Unmarshal(run.Report, &rep); err != nil {
		return chargeonce.Errorf(chargeonce.EINTERNAL, "the stored report does not decode: %v", err)
	}
	found := false
	for _, m := range rep.Mismatches {
		found = found || (string(m.Type) == a.Type && m.Reference == a.Reference && m.ObjectReference == a.ObjectReference)
	}
	if !found {
		return chargeonce.Errorf(chargeonce.ENOTFOUND, "the run of %s %s has no %s exception for %s", a.Acquirer, a.Period, a.Type, a.Reference)
	}
	if _, err := ops.ReconAckInsert(r.Context(), a); err != nil {
		return err
	}
	http.Redirect(w, r, "/admin/recon?"+url.Values{"acquirer": {a.Acquirer}, "period": {a.Period}}.Encode(), http.StatusSeeOther)
	return nil
}
