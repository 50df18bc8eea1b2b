-- Number 0037 was assigned to a change (issue 31's deploy --wait) that needed no SQL.
-- Kept as an empty migration so the numbers stay contiguous: a later file never
-- takes a number below one a store has already applied.
select 1;
