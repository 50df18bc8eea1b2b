-- Every JSON value the SQL API stores must be one a worker can read back
-- (issue 29 §3). Size alone let through an input nested 3,000 levels deep (6 KB)
-- or holding a 5,001-digit number: Postgres keeps both, Python's json cannot
-- read either, and the claim that read such a row failed for its whole batch.
--
-- value_limits() is the one table of limits; worker/limits.py and
-- worker/jsonvalue.py hold the same numbers and tests/integration/
-- test_readable_values.py holds the two to each other. The existing functions
-- keep their signatures and only refuse more, so an older build's calls
-- (submit_run, signal_run, report_runner_result: all through checked_size)
-- work unchanged and get the new checks too.

create or replace function {schema}.value_limits()
  returns table (max_depth integer, max_integer_digits integer, max_value_bytes integer,
                 max_key_chars integer, max_play_chars integer)
  language sql
  immutable
as $$
  -- max_depth: levels below the top value (Python's decoder recurses per level);
  -- max_integer_digits: Python's default int-to-string limit (4,300 digits).
  select 512, 4300, 1048576, 255, 200
$$;

-- Refuse (22023) a value a worker could not read back, naming p_what and why:
-- over max_value_bytes as Postgres prints it, nested deeper than max_depth, or
-- holding a number Python's json cannot read (an integer of more digits than
-- max_integer_digits, or a fraction beyond a float's range, which it reads as
-- infinity). NUL and unpaired surrogates never reach here: jsonb refuses them.
create or replace function {schema}.checked_value(p_value jsonb, p_what text)
  returns jsonb
  language plpgsql
  immutable
as $$
declare
  v_limits record;
  v_text text;
  v_size integer;
  v_number text;
begin
  if p_value is null then
    return null;
  end if;
  v_text := p_value::text;
  v_size := octet_length(v_text);
  -- The common case, kept cheap for bulk submits: a text this short is within
  -- every limit (it nests at most 154 levels and holds no 309-digit number).
  if v_size < 309 then
    return p_value;
  end if;
  select * into v_limits from {schema}.value_limits();
  if v_size > v_limits.max_value_bytes then
    raise exception '% is % bytes of JSON, more than the % bytes (1 MiB) allowed: store large data elsewhere and pass a reference to it.',
      p_what, v_size, v_limits.max_value_bytes
      using errcode = '22023';
  end if;
  -- Each level takes at least two characters ([ and ]): a shorter text is shallow.
  if v_size > 2 * v_limits.max_depth
     and jsonb_path_exists(p_value, format('strict $.**{%s}', v_limits.max_depth + 1)::jsonpath)
  then
    raise exception '% nests deeper than % levels, which lane-worker cannot read back: flatten it.',
      p_what, v_limits.max_depth
      using errcode = '22023';
  end if;
  -- A number past a float's range has at least 309 digits in a row.
  if v_text ~ '[0-9]{255}[0-9]{54}' then  -- a count is at most 255 in a regex
    select n::text into v_number
      from jsonb_path_query(
             p_value,
             'strict $.** ? (@.type() == "number" && (@ > $f || @ < -$f))',
             jsonb_build_object('f', 1.7976931348623157e308::numeric)) n
     where position('.' in n::text) > 0
        or abs(n::numeric) >= 10::numeric ^ v_limits.max_integer_digits
     limit 1;
    if v_number is not null then
      raise exception '% holds a number of % digits, which lane-worker cannot read back: an integer has at most % digits and a fraction must fit a double; send it as a string.',
        p_what, char_length(regexp_replace(v_number, '[^0-9]', '', 'g')),
        v_limits.max_integer_digits
        using errcode = '22023';
    end if;
  end if;
  return p_value;
end;
$$;

-- Kept under its 0008 name, which submit_run, signal_run (0008) and
-- report_runner_result (0010) call, of every build: since 0019 it checks every
-- limit, not only the size.
create or replace function {schema}.checked_size(p_value jsonb, p_what text)
  returns jsonb
  language sql
  immutable
as $$
  select {schema}.checked_value(p_value, p_what)
$$;

create or replace function {schema}.checked_key(p_key text, p_what text)
  returns text
  language plpgsql
  immutable
as $$
declare
  v_max integer := (select max_key_chars from {schema}.value_limits());
begin
  if p_key is null then
    return null;
  end if;
  if {schema}.lane_trim(p_key) = '' then
    raise exception '% must be a non-blank string.', p_what using errcode = '22023';
  end if;
  if char_length(p_key) > v_max then
    raise exception '% % is not usable: a key has at most % characters and no NUL or unpaired surrogate character.',
      p_what, quote_literal(left(p_key, 100)) || '...', v_max
      using errcode = '22023';
  end if;
  return p_key;
end;
$$;
