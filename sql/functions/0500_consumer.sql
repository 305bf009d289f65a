-- The consumer's own calls (issue 20; src/api/deliveries.rs,
-- docs/protocol.md "The consumer's own view"). Each takes the calling
-- service's id and treats another service's delivery or watch as missing
-- (P0002, a 404 at the API): a service sees only its own.

-- Queue a settled delivery again under the same id (the consumer
-- de-duplicates by it), as retry() does for the operator, but for any
-- delivery the service has that was delivered, failed or dropped: GitHub's
-- "Redeliver". The order rule (0200_pump.sql) holds: a superseded delivery,
-- or one whose (watch, object) has newer news sent or on its way
-- (newer_news()), is refused (55000, a 409), as is one still queued.
-- Recorded as a 'retry' action by p_actor. Returns the state it had.
create or replace function watchpump.redeliver(p_service_id bigint, p_delivery_id bigint, p_actor text)
returns text
language plpgsql as $$
declare
    v_state       text;
    v_error       text;
    v_by          bigint;
    v_newer       bigint;
    v_newer_state text;
begin
    select d.state, d.last_error, d.superseded_by into v_state, v_error, v_by
    from watchpump.settled d
    where d.id = p_delivery_id and d.service_id = p_service_id
    for update;
    if not found then
        select case when q.lease_until > now() then 'in flight' else 'queued' end into v_state
        from watchpump.queue q
        where q.id = p_delivery_id and q.service_id = p_service_id;
        if not found then
            raise exception 'watchpump.redeliver: there is no delivery % for this service', p_delivery_id
                using errcode = 'P0002';
        end if;
        raise exception 'watchpump.redeliver: delivery % is % already', p_delivery_id, v_state
            using errcode = '55000';
    end if;
    if v_state = 'superseded' then
        raise exception 'watchpump.redeliver: delivery % was superseded by delivery %, which carries newer news of the same object',
            p_delivery_id, v_by
            using errcode = '55000';
    end if;
    select n.delivery_id, n.state into v_newer, v_newer_state
    from watchpump.newer_news(p_delivery_id) n;
    if found then
        raise exception 'watchpump.redeliver: delivery % of the same object, with newer news, was already sent or is on its way (it is %)',
            v_newer, v_newer_state
            using errcode = '55000';
    end if;
    perform watchpump.requeue(array[p_delivery_id]);
    insert into watchpump.actions (delivery_id, action, actor, from_state, note)
    values (p_delivery_id, 'retry', p_actor, v_state, 'redelivery asked for by the consumer');
    return v_state;
end
$$;

-- A ping to one of the service's live watches: a change of kind
-- 'watchpump.ping' on the object 'watchpump.ping/<watch id>' (never a
-- producer's object, so it supersedes nothing but an older ping of the same
-- watch), and one delivery of it to that watch alone, queued like any
-- other: signed, retried, listed. Never through emit(): no other watch
-- receives it and strict mode does not apply. Bounded (README, "Bounds"):
-- at most one ping per watch per p_every; a sooner one is refused with
-- 54000 (a 429). A removed watch is P0002 (404). Returns the delivery's id.
create or replace function watchpump.ping(p_service_id bigint, p_watch_id bigint, p_every interval)
returns bigint
language plpgsql as $$
declare
    v_removed  timestamptz;
    v_object   text := 'watchpump.ping/' || p_watch_id;
    v_last     timestamptz;
    v_sequence bigint;
    v_payload  jsonb;
    v_change   bigint;
    v_id       bigint;
begin
    select w.removed_at into v_removed
    from watchpump.watches w
    where w.id = p_watch_id and w.service_id = p_service_id
    for update;
    if not found then
        raise exception 'watchpump.ping: there is no watch % for this service', p_watch_id
            using errcode = 'P0002';
    elsif v_removed is not null then
        raise exception 'watchpump.ping: watch % was removed', p_watch_id
            using errcode = 'P0002';
    end if;
    -- The watch's row lock above serialises pings of one watch.
    select max(d.created_at) into v_last
    from watchpump.deliveries d
    where d.watch_id = p_watch_id and d.object = v_object;
    if v_last > now() - p_every then
        raise exception 'watchpump.ping: watch % was pinged less than % ago', p_watch_id, p_every
            using errcode = '54000';
    end if;
    insert into watchpump.objects as o (object, last_sequence)
    values (v_object, 1)
    on conflict (object) do update set last_sequence = o.last_sequence + 1
    returning o.last_sequence into v_sequence;
    v_payload := jsonb_build_object('watch_id', p_watch_id, 'zen', 'pong');
    insert into watchpump.changes (object, kind, sequence, payload, payload_bytes)
    values (v_object, 'watchpump.ping', v_sequence, v_payload, octet_length(v_payload::text))
    returning id into v_change;
    insert into watchpump.queue (change_id, watch_id, service_id, object, deadline)
    values (v_change, p_watch_id, p_service_id, v_object, now() + watchpump.delivery_window())
    returning id into v_id;
    perform pg_notify('watchpump', '');
    return v_id;
end
$$;
