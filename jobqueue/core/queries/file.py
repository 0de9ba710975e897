"""Statements on sa_file and sa_file_chunk: the Batch API's files, stored in pieces.

Every read and write names the caller's org; another org's file is never found (404).
"""

__all__ = [
    "FILE_CHUNK_INSERT",
    "FILE_CHUNK_LIST_PAGE",
    "FILE_COLUMNS",
    "FILE_COMPLETE",
    "FILE_COUNT_LINES",
    "FILE_DELETE",
    "FILE_DELETE_EXPIRED_MANY",
    "FILE_DELETE_FOR_REWRITE",
    "FILE_DELETE_INCOMPLETE",
    "FILE_GET",
    "FILE_INSERT",
    "FILE_LIST_PAGE_ASC",
    "FILE_LIST_PAGE_DESC",
    "FILE_NEXT_SEQ",
    "FILE_ORG_BYTES",
]

FILE_COLUMNS = "id, org_id, purpose, filename, bytes, lines, created_at, expires_at"

# served by sa_file_org_created_idx (org_id, created_at, id) (0025_openai_batches.sql): what the
# org stores, uploads still streaming included, for SA_ORG_MAX_FILE_BYTES.
FILE_ORG_BYTES = "SELECT coalesce(sum(bytes), 0)::bigint AS bytes FROM sa_file WHERE org_id = %(org_id)s"

# served by sa_file_pkey (id). A new file, invisible until FILE_COMPLETE.
FILE_INSERT = """
INSERT INTO sa_file (id, org_id, created_by, purpose, filename)
VALUES (%(id)s, %(org_id)s, %(user_id)s, %(purpose)s, %(filename)s)
"""

# served by sa_file_pkey (id). A batch's output or error file is written again from its first
# piece when a keeper resumes a write none of whose slices committed (its id derives from the
# batch's), so whatever an earlier try left goes first (its pieces with it, ON DELETE CASCADE);
# FILE_INSERT then writes it anew.
FILE_DELETE_FOR_REWRITE = """
DELETE FROM sa_file WHERE id = %(id)s AND org_id IS NOT DISTINCT FROM %(org_id)s
"""

# served by sa_file_chunk_pkey (file_id, seq), one probe from its end: where the next piece goes.
FILE_NEXT_SEQ = """
SELECT coalesce(max(seq) + 1, 0) AS seq FROM sa_file_chunk WHERE file_id = %(file_id)s
"""

# served by sa_file_chunk_pkey (file_id, seq); the file's size grows with it (sa_file_pkey), so
# the org's storage sum counts an upload while it streams.
FILE_CHUNK_INSERT = """
WITH piece AS (
    INSERT INTO sa_file_chunk (file_id, seq, data) VALUES (%(file_id)s, %(seq)s, %(data)s)
)
UPDATE sa_file SET bytes = bytes + octet_length(%(data)s), lines = lines + %(lines)s
 WHERE id = %(file_id)s
"""

# served by sa_file_pkey (id): a last line without a newline, counted when the upload ends.
FILE_COUNT_LINES = "UPDATE sa_file SET lines = lines + %(lines)s WHERE id = %(file_id)s"

# served by sa_file_pkey (id): an upload refused or cut, with whatever pieces it wrote.
FILE_DELETE_INCOMPLETE = """
DELETE FROM sa_file WHERE id = %(id)s AND org_id IS NOT DISTINCT FROM %(org_id)s AND NOT complete
"""

# served by sa_file_pkey (id)
FILE_COMPLETE = """
UPDATE sa_file
   SET complete = true,
       expires_at = CASE WHEN %(ttl)s::float8 IS NULL THEN NULL
                         ELSE created_at + make_interval(secs => %(ttl)s) END
 WHERE id = %(id)s AND org_id IS NOT DISTINCT FROM %(org_id)s
RETURNING """ + FILE_COLUMNS

# served by sa_file_pkey (id); the org is checked on the row found (queries/job.py explains the
# form).
FILE_GET = ("SELECT " + FILE_COLUMNS + """
  FROM sa_file
 WHERE id = %(id)s AND org_id IS NOT DISTINCT FROM %(org_id)s AND complete
""")

# served by sa_file_org_created_idx (org_id, created_at, id): a page of the org's complete files
# after the keyset `(after_created, after_id)` (NULL: from the start), optionally one purpose.
_FILE_LIST = ("SELECT " + FILE_COLUMNS + """
  FROM sa_file
 WHERE org_id = %(org_id)s AND complete
   AND (%(purpose)s::text IS NULL OR purpose = %(purpose)s)
""")
FILE_LIST_PAGE_DESC = _FILE_LIST + """
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, id) < (%(after_created)s::timestamptz, %(after_id)s::uuid))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s
"""
FILE_LIST_PAGE_ASC = _FILE_LIST + """
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, id) > (%(after_created)s::timestamptz, %(after_id)s::uuid))
 ORDER BY created_at, id
 LIMIT %(limit)s
"""

# served by sa_file_pkey (id); its pieces go with it (ON DELETE CASCADE, sa_file_chunk_pkey).
FILE_DELETE = """
DELETE FROM sa_file WHERE id = %(id)s AND org_id IS NOT DISTINCT FROM %(org_id)s AND complete
RETURNING id
"""

# served by sa_file_chunk_pkey (file_id, seq): the next pieces of a file from `seq` on, a few at a
# time so a download holds a connection only while it reads them.
FILE_CHUNK_LIST_PAGE = """
SELECT seq, data
  FROM sa_file_chunk
 WHERE file_id = %(file_id)s AND seq >= %(seq)s
 ORDER BY seq
 LIMIT %(limit)s
"""

# served by sa_file_expires_idx (expires_at) and sa_file_incomplete_idx (created_at) WHERE NOT
# complete: the retention's removal of files past their expiry and of uploads abandoned for
# `abandoned` seconds (their web process died), `limit` at a time, pieces with them.
FILE_DELETE_EXPIRED_MANY = """
DELETE FROM sa_file f
 USING (
    (SELECT id FROM sa_file WHERE expires_at <= now() ORDER BY expires_at LIMIT %(limit)s)
    UNION
    (SELECT id FROM sa_file
      WHERE NOT complete AND created_at <= now() - make_interval(secs => %(abandoned)s)
      ORDER BY created_at LIMIT %(limit)s)
 ) doomed
 WHERE f.id = doomed.id
"""
