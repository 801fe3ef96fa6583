// The CLI run as the README runs it (`npm run cli -- ...`), in a child process with `env` over this
// process's environment (a value undefined: left out).
import { spawn } from 'node:child_process';
import { ROOT } from './stack.ts';

export interface CliRun { code: number | null; stdout: string; stderr: string }

export const runCli = (args: string[], env: Record<string, string | undefined>): Promise<CliRun> => runNpm(['run', 'cli'], args, env);

/** `npm <command> --silent -- <args>`: `npm start`, `npm run migrate`, ... as an operator types them. */
export function runNpm(command: string[], args: string[], env: Record<string, string | undefined>): Promise<CliRun> {
  const full = { ...process.env, ...env };
  return new Promise((resolve, reject) => {
    const child = spawn('npm', [...command, '--silent', '--', ...args], { cwd: ROOT, env: full as NodeJS.ProcessEnv, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b) => { stdout += b; });
    child.stderr.on('data', (b) => { stderr += b; });
    child.on('error', reject);
    child.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}
