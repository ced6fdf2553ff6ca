-- 0011_events_for_every_settlement: every settlement records exactly one
-- event, whether or not its merchant has an enabled endpoint (mirrors the
-- PostgreSQL migration). 0010's trigger wrote it only when the merchant had
-- an enabled endpoint: a charge settled while its merchant had none had no
-- event at all. The trigger is recreated without that condition; the
-- fan-out (0010) still creates deliveries for the endpoints enabled when
-- the event is recorded, so a merchant without one gets the event and no
-- delivery.
--
-- The charges settled before, without an event, get theirs, with the time
-- each settled; they fan out like any other, to the endpoints enabled now.

DROP TRIGGER charges_webhook_event;

CREATE TRIGGER charges_webhook_event
AFTER UPDATE OF status ON charges
FOR EACH ROW
WHEN OLD.status = 'processing' AND NEW.status IN ('captured', 'declined')
BEGIN
    INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, type, created_at)
    VALUES ('evt_' || substr(NEW.id, 4), NEW.merchant_id, NEW.id, 'charge.' || NEW.status,
            CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000);
END;

INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, type, created_at)
SELECT 'evt_' || substr(id, 4), merchant_id, id, 'charge.' || status, updated_at
FROM charges
WHERE status IN ('captured', 'declined');
