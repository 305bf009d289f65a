-- The consumer kit's inbox logic (watchpump::kit). `create or replace`
-- definitions, re-applied by watchpump::kit::migrate() whenever this file
-- changes. Each runs inside the caller's transaction.

-- Decides what to do with a delivery whose token and signature were checked,
-- inside the transaction that will also hold the consumer's work:
--   'new'            recorded; run the consumer's handler, then commit
--                    (or roll back, and this row goes with the work);
--   'duplicate'      this delivery id was accepted before: answer 2xx, do
--                    nothing (a concurrent copy waits here for the first
--                    copy's transaction, and then finds its row);
--   'stale'          recorded as skipped: not newer than the (watch,
--                    object)'s stored sequence; answer 2xx, do not run the work;
--   'unknown_watch'  not a watch this consumer registered: refuse (403),
--                    nothing written;
--   'removed_watch'  a watch this consumer removed: answer 410 so the
--                    producer drops it too, nothing written.
create or replace function watchpump_inbox.receive(
    p_producer     text,
    p_delivery_id  bigint,
    p_watch_id     bigint,
    p_change_id    bigint,
    p_object       text,
    p_kind         text,
    p_sequence     bigint,
    p_occurred_at  timestamptz,
    p_attempt      int,
    p_payload      jsonb
) returns text
language plpgsql as $$
declare
    v_removed_at timestamptz;
begin
    -- FOR SHARE: forgetting the watch (a 410 elsewhere) waits for us.
    select w.removed_at into v_removed_at
    from watchpump_inbox.watches w
    where w.producer = p_producer and w.watch_id = p_watch_id
    for share;
    if not found then
        return 'unknown_watch';
    elsif v_removed_at is not null then
        return 'removed_watch';
    end if;

    insert into watchpump_inbox.deliveries
        (producer, delivery_id, watch_id, change_id, object, kind, sequence,
         occurred_at, attempt, outcome, payload)
    values
        (p_producer, p_delivery_id, p_watch_id, p_change_id, p_object, p_kind, p_sequence,
         p_occurred_at, p_attempt, 'done', p_payload)
    on conflict (producer, delivery_id) do nothing;
    if not found then
        return 'duplicate';
    end if;

    -- Advance the object's position only forwards. The row lock taken here
    -- orders two deliveries of one object that arrive at once.
    insert into watchpump_inbox.positions (producer, watch_id, object, sequence, delivery_id)
    values (p_producer, p_watch_id, p_object, p_sequence, p_delivery_id)
    on conflict (producer, watch_id, object) do update
        set sequence = excluded.sequence,
            delivery_id = excluded.delivery_id,
            updated_at = now()
        where watchpump_inbox.positions.sequence < excluded.sequence;
    if found then
        return 'new';
    end if;

    update watchpump_inbox.deliveries
    set outcome = 'skipped'
    where producer = p_producer and delivery_id = p_delivery_id;
    return 'stale';
end;
$$;

-- Records a watch the producer created (or returned, when an identical live
-- watch existed). Registering a removed watch's id again revives it: the
-- producer says it is live.
create or replace function watchpump_inbox.remember_watch(
    p_producer  text,
    p_watch_id  bigint,
    p_resource  text,
    p_object    text,
    p_filters   jsonb
) returns void
language sql as $$
    insert into watchpump_inbox.watches (producer, watch_id, resource, object, filters)
    values (p_producer, p_watch_id, p_resource, p_object, coalesce(p_filters, '{}'))
    on conflict (producer, watch_id) do update
        set resource = excluded.resource,
            object = excluded.object,
            filters = excluded.filters,
            removed_at = null,
            removed_reason = null;
$$;

-- Marks a watch removed: deliveries for it are answered 410 from now on.
-- Returns false when it was unknown or removed already.
create or replace function watchpump_inbox.forget_watch(
    p_producer  text,
    p_watch_id  bigint,
    p_reason    text
) returns boolean
language sql as $$
    with removed as (
        update watchpump_inbox.watches
        set removed_at = now(), removed_reason = p_reason
        where producer = p_producer and watch_id = p_watch_id and removed_at is null
        returning 1
    )
    select exists (select from removed);
$$;

-- Deletes up to p_batch accepted deliveries received before p_before,
-- oldest first; returns how many. Call it until it returns less than
-- p_batch. It does not weaken de-duplication: a late copy of a pruned
-- delivery is still refused by watchpump_inbox.positions, since its sequence
-- is not newer than the one stored (it is recorded as skipped). Keep rows
-- longer than the producer's delivery window (a day) to read them as a log.
create or replace function watchpump_inbox.prune(p_before timestamptz, p_batch int)
returns int
language sql as $$
    with doomed as (
        select producer, delivery_id
        from watchpump_inbox.deliveries
        where received_at < p_before
        order by received_at
        limit p_batch
    ), deleted as (
        delete from watchpump_inbox.deliveries d
        using doomed
        where d.producer = doomed.producer and d.delivery_id = doomed.delivery_id
        returning 1
    )
    select count(*)::int from deleted;
$$;

-- What the kit knows about one producer's watches, for listing.
create or replace view watchpump_inbox.watch_list as
select w.producer, w.watch_id, w.resource, w.object, w.filters,
       w.registered_at, w.removed_at, w.removed_reason,
       w.removed_at is null as live,
       (select count(*) from watchpump_inbox.positions p
        where p.producer = w.producer and p.watch_id = w.watch_id) as objects_seen
from watchpump_inbox.watches w;
