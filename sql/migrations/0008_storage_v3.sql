-- Storage v3 (issue 18): facts the history got wrong, made right.

-- Settings watchpump reads where it uses them, at every call, so that a
-- change reaches every running pump and producer connection at once (a
-- setting made with `alter database ... set` is read by a connection only
-- when it starts). One row.
create table watchpump.settings (
    singleton        boolean primary key default true check (singleton),
    -- How long a delivery is retried: its deadline is set to now() plus
    -- this when it is emitted (or retried by an operator). Null: 24 hours.
    delivery_window  interval check (delivery_window > interval '0')
);
insert into watchpump.settings default values;

-- An ending that an operator's retry undid stays in the history: the
-- action keeps when the delivery ended and what it said then
-- (watchpump.delivery_history shows it as its own event).
alter table watchpump.actions add column ended_at     timestamptz,
                              add column ended_detail text;

-- sweep() no longer returns expired_leases (always 0: claim() takes
-- expired leases again itself); sql/functions/ makes it again.
drop function if exists watchpump.sweep(text, interval);

-- complete() also says when a retried delivery is due (its last retry is
-- due at its deadline, which the pump's own wake-ups need to know).
drop function if exists watchpump.complete(text, bigint[], integer[], text[], integer[], text[],
                                           timestamptz[], double precision[], text[], timestamptz[]);
