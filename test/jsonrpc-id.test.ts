// domain/jsonrpc-id.ts on its own: which number ids JSON.parse reads as another number, found from
// the request's text. Both JSON-RPC endpoints refuse those (a2a-jsonrpc, mcp); here the scan itself
// is held to the JSON it will meet: escaped member names, nested ids, batches, strings with brackets.
import assert from 'node:assert/strict';
import { idLiterals, inexactId } from '../domain/jsonrpc-id.ts';

const check = (text: string) => inexactId(JSON.parse(text), text);

describe('jsonrpc-id: idLiterals', () => {
  it('finds the literal of a message\'s own number id, and none for a string or null id', () => {
    assert.deepEqual(idLiterals('{"jsonrpc":"2.0","id":12.50,"method":"x"}'), ['12.50']);
    assert.deepEqual(idLiterals('{"id" : -1e-400 }'), ['-1e-400']);
    assert.deepEqual(idLiterals('{"id":"7"}'), [undefined]);
    assert.deepEqual(idLiterals('{"id":null}'), [undefined]);
  });

  it('skips ids nested in params, and brackets, quotes and "id" inside strings', () => {
    const text = '{"params":{"id":1.5,"list":[{"id":2.5}],"s":"{\\"id\\":3.5 ] ["},"method":"a,b","id":4}';
    assert.deepEqual(idLiterals(text), ['4']);
  });

  it('reads a member name written with escapes as JSON.parse does, and the last of a repeated id', () => {
    assert.deepEqual(idLiterals('{"\\u0069d":0.1}'), ['0.1']);
    assert.deepEqual(idLiterals('{"id":1,"x":{"id":9},"id":2.25}'), ['2.25']);
  });

  it('indexes a batch by member, past nested arrays and members without an id', () => {
    const text = '[{"id":1,"params":[1,2,{"id":5}]},{"method":"m"},{"id":3.0}]';
    const literals = idLiterals(text);
    assert.equal(literals.length, 3);
    assert.deepEqual([literals[0], literals[1], literals[2]], ['1', undefined, '3.0']);
  });
});

describe('jsonrpc-id: inexactId', () => {
  it('passes every id JSON.parse keeps: integers, exact decimals, other spellings of one number', () => {
    for (const id of ['0', '-0', '42', '9007199254740991', '0.5', '1.25e2', '125E-0', '1.000', '0.1', '-123.456', '1e21']) {
      assert.equal(check(`{"jsonrpc":"2.0","id":${id},"method":"m"}`), undefined, id);
    }
  });

  it('names the first id read as another number, with its index and both spellings', () => {
    const one = check('{"id":123456789.123456789}');
    assert.equal(one?.index, 0);
    assert.match(one!.problem, /^id 123456789\.123456789 would be echoed as 123456789\.12345679, another number/);
    assert.match(check('{"id":1e-400}')!.problem, /would be echoed as 0,/);
    const batch = check('[{"id":1},{"id":"x"},{"id":0.30000000000000001},{"id":1e-999}]');
    assert.deepEqual(batch?.index, 2);
  });

  it('leaves integers past 2^53 to the endpoints, and reads no text when no id is a number', () => {
    assert.equal(check('{"id":9007199254740993}'), undefined);
    // The text is not read: scanning this one would throw (a member name JSON cannot read).
    assert.throws(() => idLiterals('{"\\q":1}'), SyntaxError);
    assert.equal(inexactId({ id: 'a' }, '{"\\q":1}'), undefined);
    assert.equal(inexactId({ id: null }, '{"\\q":1}'), undefined);
  });

  it('scans a long literal in linear time (no regular expression backtracking over its zeros)', () => {
    const text = `{"id":1.${'0'.repeat(1_000_000)}1}`;
    assert.match(check(text)!.problem, /would be echoed as 1,/);
  });
});
