"""Bytecodes executed per kvsim function in simulate() on W1 cut to N requests.

usage: python bytecodes.py TREE N OUT.json -> prints the total; OUT.json maps
"file:function:first line" to [bytecodes, calls]. (sys.settrace with opcode
events: slow, and blind to the C work a bytecode starts; compare trees with
ir.sh first.)
"""
import sys, os, collections, json
repo=sys.argv[1]; N=int(sys.argv[2]); sys.path.insert(0, repo); os.chdir(repo)
import kvsim
from kvsim.scenario.loader import load_scenario
sc = load_scenario('scenarios/bench/w1.yaml', overrides=[f'workload.trace.max_requests={N}'])
kvsim.simulate(sc)  # warm imports
sc = load_scenario('scenarios/bench/w1.yaml', overrides=[f'workload.trace.max_requests={N}'])
counts=collections.Counter(); calls=collections.Counter()
def tracer(frame, event, arg):
    code=frame.f_code
    if event=='call':
        calls[code]+=1
        frame.f_trace_opcodes=True
        return tracer
    if event=='opcode':
        counts[code]+=1
    return tracer
sys.settrace(tracer)
kvsim.simulate(sc)
sys.settrace(None)
out={}
for code,n in counts.items():
    key=f"{code.co_filename.replace(repo,'').split('site-packages/')[-1]}:{code.co_name}:{code.co_firstlineno}"
    a=out.get(key,[0,0]); a[0]+=n; a[1]+=calls[code]; out[key]=a
json.dump(out, open(sys.argv[3],'w'))
print(sum(counts.values()))
