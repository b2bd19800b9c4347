"""What a compile is served: the session of one ``use(...)`` block (``session``), its misses reported (``misses``), the
transfers it serves (``transfers``), the rewrites it chooses by what the registry holds (``choice``), its report
(``report``), and the MetaSchedule database over the registry (``database``). The top layer below ``hooks.pipeline``."""
